#include "ring/spsc_ring.h"

namespace ivcuda::ring {

namespace {
abi::RecordHeader* header_at(const RingView& v, std::uint32_t idx) noexcept {
  return reinterpret_cast<abi::RecordHeader*>(v.data +
                                              std::size_t{idx & (v.cells - 1)} * abi::kCellBytes);
}
}  // namespace

// ---------------------------------------------------------------- Producer

Producer::Producer(RingView view, Doorbell* bell) noexcept : v_(view), bell_(bell) {
  // Our own index: relaxed, nobody else writes it in a well-behaved ring.
  tail_ = published_ = load_relaxed(v_.ctl->tail);
  // The oldest head that can be valid: refresh_head() accepts any head in
  // [tail - cells, tail] now, and only forward moves after.
  head_cache_ = tail_ - v_.cells;
  refresh_head();
}

std::uint32_t Producer::max_payload() const noexcept {
  return v_.cells / 2 * abi::kCellBytes - static_cast<std::uint32_t>(sizeof(abi::RecordHeader));
}

bool Producer::refresh_head() noexcept {
  // [A2] pairs with [R2]: cells the consumer released are free to reuse.
  const std::uint32_t head = load_acquire(v_.ctl->head);
  // A consumer can only release what was published, and cannot take back
  // what it released: anything else is a hostile or broken peer. Accepting a
  // head that moved back would put more than `cells` in flight, and the next
  // reserve would overwrite unconsumed cells.
  if (head - head_cache_ > published_ - head_cache_) {
    corrupt_ = true;
    return false;
  }
  head_cache_ = head;
  return true;
}

bool Producer::drained() noexcept {
  if (!refresh_head()) return false;
  return head_cache_ == tail_;
}

std::byte* Producer::reserve(const abi::RecordHeader& hdr, RingStatus* st) noexcept {
  if (corrupt_) {
    *st = RingStatus::kCorrupt;
    return nullptr;
  }
  if (hdr.len > max_payload()) {
    *st = RingStatus::kTooBig;
    return nullptr;
  }
  const std::uint32_t need = record_cells(hdr.len);
  const std::uint32_t pos = tail_ & (v_.cells - 1);
  const std::uint32_t to_end = v_.cells - pos;
  const std::uint32_t pad = need > to_end ? to_end : 0;
  auto fits = [&] { return v_.cells - (tail_ - head_cache_) >= pad + need; };
  if (!fits()) {
    if (!refresh_head()) {
      *st = RingStatus::kCorrupt;
      return nullptr;
    }
    if (!fits()) {
      *st = RingStatus::kFull;
      return nullptr;
    }
  }
  if (pad != 0) {
    abi::RecordHeader p{};
    p.len = pad * abi::kCellBytes - static_cast<std::uint32_t>(sizeof(abi::RecordHeader));
    p.op = abi::kOpPad;
    std::memcpy(header_at(v_, tail_), &p, sizeof p);
    tail_ += pad;
  }
  auto* h = header_at(v_, tail_);
  std::memcpy(h, &hdr, sizeof hdr);
  reserved_ = need;
  *st = RingStatus::kOk;
  return reinterpret_cast<std::byte*>(h + 1);
}

void Producer::commit() noexcept {
  tail_ += reserved_;
  reserved_ = 0;
}

bool Producer::publish() noexcept {
  if (published_ == tail_) return false;
  // [R1] pairs with [A1]: the consumer sees every byte written before this.
  store_release(v_.ctl->tail, tail_);
  published_ = tail_;
  // [F2] pairs with [F1]: order the tail store before the sleeping load.
  full_fence();
  if (load_relaxed(v_.ctl->consumer_sleeping) != 0 && bell_ != nullptr) {
    bell_->ring();
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- Consumer

Consumer::Consumer(RingView view) noexcept : v_(view) {
  head_ = published_ = load_relaxed(v_.ctl->head);
  tail_cache_ = head_;
}

bool Consumer::refresh_tail() noexcept {
  // [A1] pairs with [R1]: records up to tail are fully written.
  const std::uint32_t tail = load_acquire(v_.ctl->tail);
  // Published records cannot be taken back: a tail behind the last one seen
  // would let poll() walk (after skipping a pad) past the published tail.
  if (tail - head_ > v_.cells || tail - head_ < tail_cache_ - head_) {
    corrupt_ = true;
    return false;
  }
  tail_cache_ = tail;
  return true;
}

bool Consumer::has_data() noexcept {
  if (corrupt_) return false;
  if (holding_ || head_ != tail_cache_) return true;
  return refresh_tail() && head_ != tail_cache_;
}

RingStatus Consumer::poll(Record* out) noexcept {
  if (corrupt_) return RingStatus::kCorrupt;
  if (holding_) {
    out->hdr = *reinterpret_cast<const abi::RecordHeader*>(buf_.data());
    out->payload = {buf_.data() + sizeof(abi::RecordHeader), out->hdr.len};
    return RingStatus::kOk;
  }
  std::uint32_t skipped = 0;
  for (;;) {
    std::uint32_t avail = tail_cache_ - (head_ + skipped);
    if (avail == 0) {
      // The record will start where the head is: ask for its line while
      // the tail is read, so that a record that has just landed costs one
      // line's transfer from the producer's core instead of two in a row
      // (ring benchmark: a spinning round trip 0.59 -> 0.50 us on the CI
      // machine). Stale contents are harmless: the header is read again
      // below, only after the tail says the record is there.
      __builtin_prefetch(header_at(v_, head_ + skipped));
      if (!refresh_tail()) return RingStatus::kCorrupt;
      avail = tail_cache_ - (head_ + skipped);
      if (avail == 0) {
        if (skipped != 0) {  // only pads were there: release them
          head_ += skipped;
        }
        return RingStatus::kEmpty;
      }
    }
    const std::uint32_t idx = head_ + skipped;
    const std::uint32_t pos = idx & (v_.cells - 1);
    const std::uint32_t to_end = v_.cells - pos;
    // Copy the header out once; every decision below uses the copy.
    abi::RecordHeader h;
    std::memcpy(&h, header_at(v_, idx), sizeof h);
    const std::uint64_t need64 =
        (std::uint64_t{sizeof h} + h.len + abi::kCellBytes - 1) / abi::kCellBytes;
    if (h.op == abi::kOpPad) {
      // A pad must fill the ring exactly to its end and be published.
      if (need64 != to_end || to_end > avail) {
        corrupt_ = true;
        return RingStatus::kCorrupt;
      }
      skipped += to_end;
      continue;
    }
    if (need64 > to_end || need64 > avail) {
      corrupt_ = true;
      return RingStatus::kCorrupt;
    }
    const std::size_t bytes = sizeof h + h.len;
    if (buf_.size() < bytes) buf_.resize(bytes);
    std::memcpy(buf_.data(), &h, sizeof h);
    std::memcpy(buf_.data() + sizeof h, reinterpret_cast<const std::byte*>(header_at(v_, idx)) + sizeof h,
                h.len);
    held_cells_ = skipped + static_cast<std::uint32_t>(need64);
    holding_ = true;
    out->hdr = h;
    out->payload = {buf_.data() + sizeof h, h.len};
    return RingStatus::kOk;
  }
}

void Consumer::consume() noexcept {
  if (!holding_) return;
  head_ += held_cells_;
  held_cells_ = 0;
  holding_ = false;
}

void Consumer::publish_head() noexcept {
  if (published_ == head_) return;
  // [R2] pairs with [A2]: our copies are done; the producer may reuse cells.
  store_release(v_.ctl->head, head_);
  published_ = head_;
}

bool Consumer::prepare_sleep() noexcept {
  publish_head();
  store_relaxed(v_.ctl->consumer_sleeping, std::uint32_t{1});
  // [F1] pairs with [F2]: the flag store is ordered before the tail re-load.
  full_fence();
  if (has_data() || corrupt_) {
    store_relaxed(v_.ctl->consumer_sleeping, std::uint32_t{0});
    return false;
  }
  return true;
}

void Consumer::end_sleep() noexcept { store_relaxed(v_.ctl->consumer_sleeping, std::uint32_t{0}); }

}  // namespace ivcuda::ring
