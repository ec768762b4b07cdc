// The JIT linker of the GPU test double (cuLinkCreate / AddData / Complete /
// Destroy). It links PTX inputs the way the double can run them: every input
// must be PTX it parses, every function one input declares .extern must be
// defined (.visible) by another, and the output is the inputs' text, which
// cuModuleLoadData takes like any PTX. Binary inputs (cubins, objects,
// libraries) answer NO_BINARY_FOR_GPU, as the double's module loader does.
#include <cctype>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "image.h"
#include "state.h"

using namespace ivcuda::gpu_double;

namespace {

struct LinkState {
  std::string text;
  std::set<std::string> defined, declared;
  char* error_log = nullptr;
  std::size_t error_cap = 0;
  char* info_log = nullptr;
  std::size_t info_cap = 0;
  bool complete = false;
};

void set_log(char* buf, std::size_t cap, const std::string& msg) {
  if (buf != nullptr && cap > 0) std::snprintf(buf, cap, "%s", msg.c_str());
}

// The function names a PTX text declares .extern and those it defines.
void scan_functions(std::string_view t, std::set<std::string>* defined, std::set<std::string>* declared) {
  for (std::size_t at = t.find(".func"); at != std::string_view::npos; at = t.find(".func", at + 5)) {
    const std::size_t line = t.rfind('\n', at);
    const std::string_view head = t.substr(line == std::string_view::npos ? 0 : line + 1, at - (line + 1));
    std::size_t p = at + 5;
    while (p < t.size() && (t[p] == ' ' || t[p] == '\t')) ++p;
    if (p < t.size() && t[p] == '(') {  // the return parameters
      const std::size_t close = t.find(')', p);
      if (close == std::string_view::npos) return;
      p = close + 1;
      while (p < t.size() && (t[p] == ' ' || t[p] == '\t')) ++p;
    }
    std::size_t e = p;
    while (e < t.size() && (std::isalnum(static_cast<unsigned char>(t[e])) || t[e] == '_' || t[e] == '$')) ++e;
    if (e == p) continue;
    const std::string name(t.substr(p, e - p));
    (head.find(".extern") != std::string_view::npos ? declared : defined)->insert(name);
  }
}

std::set<LinkState*>& live() {
  static std::set<LinkState*> l;
  return l;
}

}  // namespace

CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option* options, void** optionValues,
                                 CUlinkState* stateOut) {
  return guarded([&](State& s) -> CUresult {
    if (stateOut == nullptr || (numOptions != 0 && (options == nullptr || optionValues == nullptr)))
      return CUDA_ERROR_INVALID_VALUE;
    Handle ctx = 0;
    if (const CUresult r = work_context(s, &ctx); r != CUDA_SUCCESS) return r;
    auto* l = new LinkState;
    for (unsigned i = 0; i < numOptions; ++i) {
      if (options[i] < 0 || options[i] >= CU_JIT_NUM_OPTIONS) {
        delete l;
        return CUDA_ERROR_INVALID_VALUE;
      }
      const auto v = reinterpret_cast<std::uintptr_t>(optionValues[i]);
      switch (options[i]) {
        case CU_JIT_ERROR_LOG_BUFFER: l->error_log = static_cast<char*>(optionValues[i]); break;
        case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: l->error_cap = static_cast<unsigned>(v); break;
        case CU_JIT_INFO_LOG_BUFFER: l->info_log = static_cast<char*>(optionValues[i]); break;
        case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES: l->info_cap = static_cast<unsigned>(v); break;
        default: break;
      }
    }
    set_log(l->error_log, l->error_cap, "");
    set_log(l->info_log, l->info_cap, "");
    live().insert(l);
    *stateOut = reinterpret_cast<CUlinkState>(l);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data, size_t size, const char* name,
                                  unsigned int, CUjit_option*, void**) {
  return guarded([&](State&) -> CUresult {
    auto* l = reinterpret_cast<LinkState*>(state);
    if (live().count(l) == 0) return CUDA_ERROR_INVALID_HANDLE;
    if (data == nullptr || size == 0 || type < 0 || type >= CU_JIT_NUM_INPUT_TYPES) return CUDA_ERROR_INVALID_VALUE;
    if (l->complete) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_JIT_INPUT_PTX) {
      set_log(l->error_log, l->error_cap, "ivcuda GPU test double: only PTX inputs can be linked");
      return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    const std::string text(static_cast<const char*>(data), ::strnlen(static_cast<const char*>(data), size));
    PtxImage parsed;
    std::string why;
    if (const CUresult r = parse_ptx(text, parsed, why); r != CUDA_SUCCESS) {
      set_log(l->error_log, l->error_cap,
              std::string("ivcuda GPU test double: ") + (name != nullptr ? name : "input") + ": " + why);
      return r;
    }
    scan_functions(text, &l->defined, &l->declared);
    l->text += text;
    l->text += '\n';
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLinkComplete(CUlinkState state, void** cubinOut, size_t* sizeOut) {
  return guarded([&](State&) -> CUresult {
    auto* l = reinterpret_cast<LinkState*>(state);
    if (live().count(l) == 0) return CUDA_ERROR_INVALID_HANDLE;
    if (cubinOut == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (l->text.empty()) return CUDA_ERROR_INVALID_VALUE;
    for (const std::string& f : l->declared)
      if (l->defined.count(f) == 0) {
        set_log(l->error_log, l->error_cap, "error   : Undefined reference to '" + f + "'");
        return CUDA_ERROR_INVALID_IMAGE;
      }
    l->complete = true;
    *cubinOut = l->text.data();  // NUL-terminated: std::string keeps one past the end
    if (sizeOut != nullptr) *sizeOut = l->text.size() + 1;
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLinkDestroy(CUlinkState state) {
  return guarded([&](State&) -> CUresult {
    auto* l = reinterpret_cast<LinkState*>(state);
    if (live().erase(l) == 0) return CUDA_ERROR_INVALID_HANDLE;
    delete l;
    return CUDA_SUCCESS;
  });
}
