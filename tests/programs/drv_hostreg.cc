// cuMemHostRegister of ordinary memory (heap, stack, globals, unaligned
// ranges, several registrations in one page) must be truly shared with the
// GPU: CPU stores seen by running kernels and kernel stores seen by the CPU
// with no API call in between; neighbouring bytes untouched; unregistering
// keeps the contents. Output is deterministic (no addresses) so that a GPU
// run can diff native against ivcuda.
//   drv_hostreg --ptx test_kernels.ptx
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <thread>

#include "check.h"

namespace {

constexpr size_t kPage = 4096;
constexpr unsigned long long kWaitNs = 10'000'000'000ull;  // the kernel's own give-up time

CUfunction g_fill, g_wait, g_inc;
CUstream g_stream;

std::vector<char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> v((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  v.push_back('\0');
  return v;
}

unsigned load(const unsigned* p) { return std::atomic_ref<unsigned>(*const_cast<unsigned*>(p)).load(); }
void store(unsigned* p, unsigned v) { std::atomic_ref<unsigned>(*p).store(v); }

// Polls *p (a plain load, no CUDA call) until it equals want; false after 20 s.
bool wait_for(const unsigned* p, unsigned want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (load(p) != want) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return true;
}

CUdeviceptr dev_ptr(void* p) {
  CUdeviceptr d = 0;
  OK(cuMemHostGetDevicePointer(&d, p, 0));
  return d;
}

// The kernel fills n words through the device alias; the CPU reads them.
void fill_through_gpu(void* p, unsigned value, unsigned long long n) {
  CUdeviceptr d = dev_ptr(p);
  void* args[] = {&d, &value, &n};
  OK(cuLaunchKernel(g_fill, 4, 1, 1, 128, 1, 1, 0, g_stream, args, nullptr));
  OK(cuStreamSynchronize(g_stream));
}

bool all_equal(const unsigned* p, size_t n, unsigned v) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != v) return false;
  return true;
}

// flag and out registered: the kernel waits for a CPU store to flag and
// answers in out, with no API call between launch and answer.
void ping_pong(unsigned* flag, unsigned* out, unsigned value, const char* what) {
  store(flag, 0);
  store(out, 0);
  CUdeviceptr df = dev_ptr(flag), dout = dev_ptr(out);
  unsigned long long timeout = kWaitNs;
  void* args[] = {&df, &dout, &timeout};
  OK(cuLaunchKernel(g_wait, 1, 1, 1, 1, 1, 1, 0, g_stream, args, nullptr));
  EXPECT(load(out) == 0);  // the kernel is waiting for us
  store(flag, value);
  const bool seen = wait_for(out, value + 1);
  EXPECT(seen);
  OK(cuStreamSynchronize(g_stream));
  std::printf("%s: kernel saw the CPU's store and the CPU saw the kernel's: %s\n", what, seen ? "yes" : "no");
}

// The counter is incremented by a kernel; the CPU sees it without a call.
void gpu_counter(unsigned* counter, const char* what) {
  const unsigned before = load(counter);
  CUdeviceptr d = dev_ptr(counter);
  void* args[] = {&d};
  OK(cuLaunchKernel(g_inc, 1, 1, 1, 32, 1, 1, 0, g_stream, args, nullptr));
  const bool seen = wait_for(counter, before + 1);
  EXPECT(seen);
  OK(cuStreamSynchronize(g_stream));
  std::printf("%s: counter incremented by the GPU seen by the CPU: %s\n", what, seen ? "yes" : "no");
}

void heap() {
  // Page-aligned with room around, so the neighbours are ours to check.
  auto* buf = static_cast<unsigned char*>(std::aligned_alloc(kPage, 5 * kPage));
  for (size_t i = 0; i < 5 * kPage; ++i) buf[i] = static_cast<unsigned char>(i * 7 + 3);
  // Unaligned start and end, over three pages.
  unsigned char* p = buf + kPage + 100;
  const size_t n = 2 * kPage + 12;  // ends 112 bytes into the fourth page
  OK(cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_DEVICEMAP));
  bool intact = true;
  for (size_t i = 0; i < 5 * kPage; ++i) intact &= buf[i] == static_cast<unsigned char>(i * 7 + 3);
  EXPECT(intact);
  // Writes of the CPU anywhere in the moved pages land (they are mapped read-write).
  buf[kPage] = 0xaa;
  buf[4 * kPage - 1] = 0xbb;
  fill_through_gpu(p + 4, 0x12345678u, (n - 8) / 4);
  EXPECT(all_equal(reinterpret_cast<unsigned*>(p + 4), (n - 8) / 4, 0x12345678u));
  EXPECT(buf[kPage] == 0xaa && buf[4 * kPage - 1] == 0xbb);
  EXPECT(buf[kPage + 99] == static_cast<unsigned char>((kPage + 99) * 7 + 3));  // the byte before the range
  // Copies to and from registered memory.
  CUdeviceptr dbuf;
  OK(cuMemAlloc(&dbuf, n));
  OK(cuMemcpyHtoD(dbuf, p, n));
  std::vector<unsigned char> back(n);
  OK(cuMemcpyDtoH(back.data(), dbuf, n));
  EXPECT(std::memcmp(back.data(), p, n) == 0);
  OK(cuMemFree(dbuf));
  gpu_counter(reinterpret_cast<unsigned*>(p + 2 * kPage), "heap");

  // attributes
  unsigned type = 0, managed = 7;
  void* host = nullptr;
  CUdeviceptr dptr = 0;
  OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p + 8)));
  EXPECT(type == CU_MEMORYTYPE_HOST);
  OK(cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, reinterpret_cast<CUdeviceptr>(p + 8)));
  EXPECT(host == p + 8);
  OK(cuPointerGetAttribute(&dptr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, reinterpret_cast<CUdeviceptr>(p + 8)));
  EXPECT(dptr == dev_ptr(p + 8));
  OK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, reinterpret_cast<CUdeviceptr>(p + 8)));
  EXPECT(managed == 0);
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                 CU_POINTER_ATTRIBUTE_HOST_POINTER};
  unsigned type2 = 0;
  CUdeviceptr dptr2 = 0;
  void* host2 = nullptr;
  void* data[] = {&type2, &dptr2, &host2};
  OK(cuPointerGetAttributes(3, attrs, data, reinterpret_cast<CUdeviceptr>(p)));
  EXPECT(type2 == CU_MEMORYTYPE_HOST && dptr2 == dev_ptr(p) && host2 == p);
  unsigned flags = 0;
  const CUresult gf = cuMemHostGetFlags(&flags, p);
  EXPECT(gf == CUDA_SUCCESS);  // driver 580 answers for registered memory too
  std::printf("cuMemHostGetFlags(registered) -> %s\n", check::name(gf));

  // errors
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister(p, n, 0));
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister(p + 10, 4, 0));
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister(p - 4, 8, 0));
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister(p + n - 1, 8, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostUnregister(p + 4));
  CUdeviceptr d;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer(&d, p, 1));

  // Unregistering keeps what the GPU wrote, and the memory stays ordinary memory.
  fill_through_gpu(p, 0x0badf00du, n / 4);
  OK(cuMemHostUnregister(p));
  EXPECT(all_equal(reinterpret_cast<unsigned*>(p), n / 4, 0x0badf00du));
  EXPECT(buf[kPage] == 0xaa && buf[4 * kPage - 1] == 0xbb);
  std::memset(p, 0x5a, n);
  EXPECT(p[0] == 0x5a && p[n - 1] == 0x5a);
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(p));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer(&d, p, 0));
  // registering again after unregistering
  OK(cuMemHostRegister(p, n, 0));
  EXPECT(p[0] == 0x5a && p[n - 1] == 0x5a);
  OK(cuMemHostUnregister(p));
  std::free(buf);
  std::printf("heap: done\n");
}

// Deep calls while a stack page is registered: their frames live in it.
int deep(int k) {
  volatile char pad[512];
  pad[0] = static_cast<char>(k);
  return k == 0 ? pad[0] : deep(k - 1) + pad[0];
}

struct StackObject {  // as NVBench's blocking kernel keeps its flags
  char tag[3];
  unsigned flag;
  unsigned long long between;
  unsigned out;
  unsigned counter;
};

void stack() {
  StackObject s{};
  std::memcpy(s.tag, "ab", 3);
  s.between = 0x1122334455667788ull;
  // Two registrations of one page (three, with the counter).
  OK(cuMemHostRegister(&s.flag, sizeof s.flag, CU_MEMHOSTREGISTER_DEVICEMAP));
  OK(cuMemHostRegister(&s.out, sizeof s.out, CU_MEMHOSTREGISTER_PORTABLE));
  OK(cuMemHostRegister(&s.counter, sizeof s.counter, 0));
  EXPECT(deep(100) == 5050);
  ping_pong(&s.flag, &s.out, 41, "stack");
  gpu_counter(&s.counter, "stack");
  // Unregistering one keeps the page shared for the others.
  OK(cuMemHostUnregister(&s.counter));
  EXPECT(deep(50) == 1275);
  ping_pong(&s.flag, &s.out, 7, "stack after one unregister");
  OK(cuMemHostUnregister(&s.flag));
  OK(cuMemHostUnregister(&s.out));
  EXPECT(std::strcmp(s.tag, "ab") == 0 && s.between == 0x1122334455667788ull && s.flag == 7 && s.out == 8);
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(&s.flag));
  std::printf("stack: done\n");
}

unsigned g_words[3000];  // a global over several pages
unsigned g_before = 0x600df00d, g_after = 0xfeedface;

// The device alias reads what the CPU wrote: n words copied out through the GPU.
std::vector<unsigned> read_through_gpu(void* p, size_t n) {
  CUdeviceptr dst;
  OK(cuMemAlloc(&dst, n * sizeof(unsigned)));
  OK(cuMemcpyDtoD(dst, dev_ptr(p), n * sizeof(unsigned)));
  std::vector<unsigned> back(n);
  OK(cuMemcpyDtoH(back.data(), dst, n * sizeof(unsigned)));
  OK(cuMemFree(dst));
  return back;
}

void globals() {
  for (unsigned i = 0; i < 3000; ++i) g_words[i] = i;
  OK(cuMemHostRegister(&g_words[5], 2000 * sizeof(unsigned), 0));
  bool same = true;
  for (unsigned i = 0; i < 3000; ++i) same &= g_words[i] == i;
  EXPECT(same);
  EXPECT(g_before == 0x600df00d && g_after == 0xfeedface);
  const std::vector<unsigned> back = read_through_gpu(&g_words[5], 2000);
  same = true;
  for (unsigned i = 0; i < 2000; ++i) same &= back[i] == i + 5;
  EXPECT(same);
  // A second registration in the last page of the first one (unless a page
  // boundary falls right after the first: then a word of a page of its own).
  auto page_of = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) / kPage; };
  const size_t j = page_of(&g_words[2006]) == page_of(&g_words[2004]) ? 2006 : 2500;
  OK(cuMemHostRegister(&g_words[j], 4, 0));
  gpu_counter(&g_words[j], "global");
  OK(cuMemHostUnregister(&g_words[5]));
  EXPECT(g_words[j] == j + 1);
  gpu_counter(&g_words[j], "global after the neighbour left");
  OK(cuMemHostUnregister(&g_words[j]));
  EXPECT(g_words[j] == j + 2 && g_words[4] == 4 && g_words[2004] == 2004);
  std::printf("globals: done\n");
}

void read_only() {
  std::vector<unsigned> v(300);
  for (unsigned i = 0; i < 300; ++i) v[i] = i * 3;
  OK(cuMemHostRegister(v.data() + 1, 200 * sizeof(unsigned), CU_MEMHOSTREGISTER_READ_ONLY));
  const std::vector<unsigned> back = read_through_gpu(v.data() + 1, 200);
  bool same = true;
  for (unsigned i = 0; i < 200; ++i) same &= back[i] == (i + 1) * 3;
  EXPECT(same);
  v[0] = 77;  // the CPU may still write it
  OK(cuMemHostUnregister(v.data() + 1));
  EXPECT(v[0] == 77 && v[299] == 897);
  std::printf("read-only: done\n");
}

void host_alloc_flags() {
  struct Case {
    unsigned flags;
  } cases[] = {{0}, {CU_MEMHOSTALLOC_PORTABLE}, {CU_MEMHOSTALLOC_DEVICEMAP},
               {CU_MEMHOSTALLOC_WRITECOMBINED}, {CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED}};
  for (const Case& c : cases) {
    void* p = nullptr;
    OK(cuMemHostAlloc(&p, 10000, c.flags));
    unsigned got = 0;
    OK(cuMemHostGetFlags(&got, p));
    std::printf("cuMemHostAlloc flags %u -> cuMemHostGetFlags %u\n", c.flags, got);
    // Allocated memory is registered already.
    const CUresult again = cuMemHostRegister(p, 64, 0);
    EXPECT(again != CUDA_SUCCESS);
    if (c.flags == 0) std::printf("cuMemHostRegister(cuMemHostAlloc memory) -> %s\n", check::name(again));
    unsigned type = 0;
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p)));
    EXPECT(type == CU_MEMORYTYPE_HOST);
    ping_pong(static_cast<unsigned*>(p), static_cast<unsigned*>(p) + 1, 3, "cuMemHostAlloc memory");
    OK(cuMemFreeHost(p));
  }
  void* p = nullptr;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostAlloc(&p, 64, 0x80));
  OK(cuMemAllocHost(&p, 0));
  OK(cuMemFreeHost(p));
}

void errors() {
  unsigned x = 0;
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostRegister(nullptr, 4, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostRegister(&x, 0, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostRegister(&x, 4, 0x80));
  const CUresult io = cuMemHostRegister(&x, 4, CU_MEMHOSTREGISTER_IOMEMORY);
  EXPECT(io != CUDA_SUCCESS);
  std::printf("cuMemHostRegister(IOMEMORY, ordinary memory) -> %s\n", check::name(io));
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(&x));
  // unmapped memory
  void* hole = ::mmap(nullptr, kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ::munmap(hole, kPage);
  const CUresult un = cuMemHostRegister(hole, 64, 0);
  EXPECT(un != CUDA_SUCCESS);
  std::printf("cuMemHostRegister(unmapped) -> %s\n", check::name(un));
  // Memory unmapped while registered, and the address reused: unregistering
  // must leave the new mapping alone.
  auto* m = static_cast<unsigned char*>(::mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE,
                                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  OK(cuMemHostRegister(m + 8, kPage, 0));
  ::munmap(m, 2 * kPage);
  void* again = ::mmap(m, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  EXPECT(again == m);
  std::memset(m, 0x3c, 2 * kPage);
  const CUresult gone = cuMemHostUnregister(m + 8);
  std::printf("cuMemHostUnregister(unmapped and reused memory) -> %s\n", check::name(gone));
  EXPECT(m[0] == 0x3c && m[2 * kPage - 1] == 0x3c);
  ::munmap(m, 2 * kPage);
  // Not a CUDA pointer: cuPointerGetAttributes answers null values.
  unsigned type = 5;
  CUpointer_attribute attr[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
  void* data[] = {&type};
  const CUresult pa = cuPointerGetAttributes(1, attr, data, reinterpret_cast<CUdeviceptr>(&x));
  std::printf("cuPointerGetAttributes(ordinary memory) -> %s, memory type %u\n", check::name(pa), type);
}

// Memory of shared mappings (a memfd mapped twice, a /dev/shm file read by
// another process): registration is recorded like any other, and what the
// GPU copies into the registered range reaches the mapping's other users.
void shared_mappings() {
  const size_t len = 4 * kPage, half = len / 2;
  const int fd = ::memfd_create("ivc-hostreg", 0);
  EXPECT(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(len)) == 0);
  auto* a = static_cast<unsigned char*>(::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  auto* b = static_cast<unsigned char*>(::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  EXPECT(a != MAP_FAILED && b != MAP_FAILED);
  if (a == MAP_FAILED || b == MAP_FAILED) return;
  const auto pat = check::random_bytes(half, 11);
  std::memcpy(a, pat.data(), half);
  OK(cuMemHostRegister(a, len, 0));
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, cuMemHostRegister(a + 100, 64, 0));
  EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostUnregister(a + 100));
  unsigned flags = 0;
  OK(cuMemHostGetFlags(&flags, a + 8));
  unsigned type = 0;
  OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(a + 8)));
  std::printf("memfd: registered, flags %u, memory type %u\n", flags, type);
  CUdeviceptr d = 0;
  OK(cuMemAlloc(&d, len));
  OK(cuMemsetD32(d + half, 0x0badf00du, half / 4));
  OK(cuMemcpyHtoD(d, a, half));                                // from the registered range
  OK(cuMemcpyDtoH(a + half, d, half));                         // the GPU's copy into it
  OK(cuMemcpyDtoHAsync(a, d + half, half, g_stream));          // and an async one
  OK(cuStreamSynchronize(g_stream));
  const bool second = std::memcmp(b + half, pat.data(), half) == 0 &&
                      all_equal(reinterpret_cast<const unsigned*>(b), half / 4, 0x0badf00du);
  EXPECT(second);
  std::printf("memfd: the second mapping sees what the GPU copied in: %s\n", second ? "yes" : "no");
  OK(cuMemHostUnregister(a));
  EXPECT_RES(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister(a));
  a[5] = 0x77;  // still one memory with the other mapping
  EXPECT(b[5] == 0x77);
  // A part of a page, registered twice in turn.
  OK(cuMemHostRegister(a + 100, 1000, 0));
  OK(cuMemHostUnregister(a + 100));
  ::munmap(a, len);
  ::munmap(b, len);
  ::close(fd);

  char path[64];
  std::snprintf(path, sizeof path, "/dev/shm/ivc-hostreg-%d", static_cast<int>(::getpid()));
  const int sfd = ::open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  EXPECT(sfd >= 0 && ::ftruncate(sfd, static_cast<off_t>(len)) == 0);
  auto* m = static_cast<unsigned char*>(::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0));
  EXPECT(m != MAP_FAILED);
  if (m == MAP_FAILED) return;
  OK(cuMemHostRegister(m, len, 0));
  OK(cuMemsetD8(d, 0x5c, len));
  OK(cuMemcpyDtoH(m, d, len));
  bool other = false;
  const pid_t child = ::fork();
  if (child == 0) {  // another process, no CUDA: reads the file
    unsigned char buf[4 * 4096];
    const int cfd = ::open(path, O_RDONLY);
    bool same = cfd >= 0 && ::read(cfd, buf, sizeof buf) == static_cast<ssize_t>(sizeof buf);
    for (size_t i = 0; same && i < sizeof buf; ++i) same = buf[i] == 0x5c;
    ::_exit(same ? 0 : 1);
  }
  int status = 1;
  if (child > 0 && ::waitpid(child, &status, 0) == child) other = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  EXPECT(other);
  std::printf("/dev/shm: another process sees what the GPU copied in: %s\n", other ? "yes" : "no");
  OK(cuMemHostUnregister(m));
  OK(cuMemFree(d));
  ::munmap(m, len);
  ::close(sfd);
  ::unlink(path);
}

// The device alias of registered shared-mapping memory (--shared-devptr;
// not in a VM's process, whose mappings the host cannot reach): a kernel
// fills the range through it and the mapping's other users see the words,
// a kernel and the CPU answer each other through it with no call between,
// and copies DMA it. A memfd whose descriptor the program keeps, and a
// /dev/shm file whose descriptor it closed (found by its path).
void shared_device_alias() {
  const size_t len = 8 * kPage;
  auto map = [&](int fd) { return static_cast<unsigned char*>(::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)); };
  auto check = [&](unsigned char* a, unsigned char* b, const char* what) {
    EXPECT(a != MAP_FAILED && b != MAP_FAILED);
    if (a == MAP_FAILED || b == MAP_FAILED) return;
    // Pages 2..5 from an unaligned start, so the alias keeps the offset in the page.
    unsigned char* p = a + 2 * kPage + 256;
    const size_t n = 3 * kPage;
    OK(cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr d = dev_ptr(p);
    CUdeviceptr attr = 0;
    OK(cuPointerGetAttribute(&attr, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, reinterpret_cast<CUdeviceptr>(p + 64)));
    EXPECT(attr == d + 64);
    fill_through_gpu(p, 0x600dcafeu, n / 4);
    const bool filled = all_equal(reinterpret_cast<const unsigned*>(b + 2 * kPage + 256), n / 4, 0x600dcafeu) &&
                        b[2 * kPage + 255] == 0 && b[2 * kPage + 256 + n] == 0;
    EXPECT(filled);
    std::printf("%s: a kernel's fill through the device alias seen in the other mapping, nothing around it: %s\n",
                what, filled ? "yes" : "no");
    auto* words = reinterpret_cast<unsigned*>(p + 1024);
    ping_pong(words, words + 16, 41, what);
    gpu_counter(words + 32, what);
    // A copy into it from device memory and out again (DMA, not staged).
    CUdeviceptr dm = 0;
    OK(cuMemAlloc(&dm, n));
    OK(cuMemsetD32(dm, 0x1234abcdu, n / 4));
    OK(cuMemcpyDtoH(p, dm, n));
    // In g_stream too: a non-blocking stream does not wait for the legacy stream's memset.
    OK(cuMemsetD32Async(dm, 0, n / 4, g_stream));
    OK(cuMemcpyHtoDAsync(dm, p, n, g_stream));
    OK(cuStreamSynchronize(g_stream));
    OK(cuMemcpyDtoH(b + 2 * kPage + 256, dm, n));  // through the other mapping, unregistered
    const bool copied = all_equal(reinterpret_cast<const unsigned*>(b + 2 * kPage + 256), n / 4, 0x1234abcdu);
    EXPECT(copied);
    std::printf("%s: copies to and from it: %s\n", what, copied ? "yes" : "no");
    OK(cuMemFree(dm));
    OK(cuMemHostUnregister(p));
    EXPECT_RES(CUDA_ERROR_INVALID_VALUE, cuMemHostGetDevicePointer(&d, p, 0));
    // Registered again at once, as a whole.
    OK(cuMemHostRegister(a, len, 0));
    fill_through_gpu(a, 7u, len / 4);
    const bool again = all_equal(reinterpret_cast<const unsigned*>(b), len / 4, 7u);
    EXPECT(again);
    std::printf("%s: registered again, filled through the GPU: %s\n", what, again ? "yes" : "no");
    OK(cuMemHostUnregister(a));
    ::munmap(a, len);
    ::munmap(b, len);
  };
  const int fd = ::memfd_create("ivc-hostreg-alias", 0);
  EXPECT(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(len)) == 0);
  check(map(fd), map(fd), "memfd alias");
  ::close(fd);

  char path[64];
  std::snprintf(path, sizeof path, "/dev/shm/ivc-hostreg-alias-%d", static_cast<int>(::getpid()));
  const int sfd = ::open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  EXPECT(sfd >= 0 && ::ftruncate(sfd, static_cast<off_t>(len)) == 0);
  // Mapped, then its descriptor closed: the path is what is left.
  unsigned char* a = map(sfd);
  unsigned char* b = map(sfd);
  ::close(sfd);
  check(a, b, "/dev/shm alias");
  ::unlink(path);
}

}  // namespace

int main(int argc, char** argv) {
  const char* ptx = check::arg(argc, argv, "--ptx");
  if (ptx == nullptr) {
    std::fprintf(stderr, "usage: drv_hostreg --ptx test_kernels.ptx\n");
    return 2;
  }
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  {
    unsigned x = 0;
    EXPECT_RES(CUDA_SUCCESS, cuMemHostRegister(&x, 4, 0));
    OK(cuMemHostUnregister(&x));
  }
  const std::vector<char> image = read_file(ptx);
  CUmodule mod;
  OK(cuModuleLoadData(&mod, image.data()));
  OK(cuModuleGetFunction(&g_fill, mod, "ivc_fill_u32"));
  OK(cuModuleGetFunction(&g_wait, mod, "ivc_wait_flag"));
  OK(cuModuleGetFunction(&g_inc, mod, "ivc_inc_u32"));
  OK(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING));
  if (check::g_failures != 0) return check::finish("drv_hostreg");

  heap();
  stack();
  globals();
  read_only();
  host_alloc_flags();
  errors();
  shared_mappings();
  if (check::flag(argc, argv, "--shared-devptr")) shared_device_alias();

  OK(cuStreamDestroy(g_stream));
  OK(cuModuleUnload(mod));
  OK(cuDevicePrimaryCtxRelease(dev));
  return check::finish("drv_hostreg");
}
