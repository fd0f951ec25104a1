// dl_open.h — the run-time loading shared by the CUDA runtime and NCCL bindings (cuda_api.cc,
// nccl_api.cc): the first library of a list that dlopen accepts, then its symbols by name.
//
// Thread-safety: none; each binding loads once, under its own static initialisation.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>
#include <type_traits>

namespace zps::worker::internal {

/// dlopen's handle of the first of `names` that loads (null entries, such as an unset
/// environment variable, are skipped), or null with each failure's dlerror appended to `tried`.
inline void* OpenFirst(std::initializer_list<const char*> names, std::string& tried) {
  for (const char* name : names) {
    if (name == nullptr || *name == '\0') continue;
    if (void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = ::dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why != nullptr ? why : name);
  }
  return nullptr;
}

/// Binds function pointers to a handle's symbols; the names not found collect in missing().
class SymbolBinder {
 public:
  explicit SymbolBinder(void* handle) : handle_(handle) {}
  template <typename Fn>
  void operator()(Fn& fn, const char* sym) {
    void* p = ::dlsym(handle_, sym);
    if (p == nullptr) {
      missing_ += std::string(missing_.empty() ? "" : ", ") + sym;
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<Fn>>(p);
  }
  const std::string& missing() const { return missing_; }

 private:
  void* handle_;
  std::string missing_;
};

}  // namespace zps::worker::internal
