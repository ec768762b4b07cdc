// Events, answered in the guest as a driver that supports no event types:
// sets can be made and freed, a device supports none (so registering any is
// NOT_SUPPORTED) and waiting times out after the time asked for.
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "guest/nvml/internal.h"

struct nvmlEventSet_st {
  int unused;
};

using namespace ivcuda::nvml;

namespace {

struct Sets {
  std::mutex mu;
  std::set<nvmlEventSet_t> live;  // sets made and not freed: anything else is refused
};
Sets& sets() noexcept {
  static Sets s;
  return s;
}

bool known(nvmlEventSet_t set) {
  Sets& s = sets();
  std::lock_guard lk(s.mu);
  return s.live.count(set) != 0;
}

nvmlReturn_t wait(nvmlEventSet_t set, nvmlEventData_t* data, unsigned timeout_ms) noexcept {
  return guard([&]() -> nvmlReturn_t {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (data == nullptr || !known(set)) return NVML_ERROR_INVALID_ARGUMENT;
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return NVML_ERROR_TIMEOUT;
  });
}

}  // namespace

extern "C" {

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set) {
  return guard([&]() -> nvmlReturn_t {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (set == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
    auto* s = new nvmlEventSet_st{};
    Sets& all = sets();
    std::lock_guard lk(all.mu);
    all.live.insert(s);
    *set = s;
    return NVML_SUCCESS;
  });
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
  return guard([&]() -> nvmlReturn_t {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    Sets& all = sets();
    std::lock_guard lk(all.mu);
    if (all.live.erase(set) == 0) return NVML_ERROR_INVALID_ARGUMENT;
    delete set;
    return NVML_SUCCESS;
  });
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long* eventTypes) {
  unsigned i = 0;
  if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
  if (eventTypes == nullptr) return NVML_ERROR_INVALID_ARGUMENT;
  *eventTypes = 0;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
  return guard([&]() -> nvmlReturn_t {
    unsigned i = 0;
    if (const nvmlReturn_t r = check_device(device, &i); r != NVML_SUCCESS) return r;
    if (!known(set)) return NVML_ERROR_INVALID_ARGUMENT;
    (void)eventTypes;  // none is supported, whichever are asked for
    return NVML_ERROR_NOT_SUPPORTED;
  });
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeoutms) {
  return wait(set, data, timeoutms);
}
nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeoutms) {
  return wait(set, data, timeoutms);
}

}  // extern "C"
