// Autocast precision: a per-thread stack of open AutocastGuards (precision.hpp).
#include "xgrad/core/autograd/precision.hpp"

#include <algorithm>
#include <iostream>
#include <sstream>
#include <vector>

#include "xgrad/core/error.hpp"

namespace xgrad {

namespace {

struct Open {
  Precision precision;
  std::shared_ptr<std::atomic<bool>> alive;  // false once the guard ended (on any thread)
};

// The calling thread's open guards, innermost last. A guard destroyed on another thread only
// clears its `alive` flag; its entry is dropped here when it reaches the top.
thread_local std::vector<Open> open_guards;

std::string thread_text(std::thread::id id) {
  std::ostringstream os;
  os << id;
  return os.str();
}

}  // namespace

std::string precision_name(Precision p) { return p == Precision::bf16 ? "bf16" : "fp32"; }

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::fp32;
  if (name == "bf16") return Precision::bf16;
  fail("parse_precision: '", name, "' is not a precision (fp32|bf16)");
}

Precision autocast_precision() {
  while (!open_guards.empty() && !open_guards.back().alive->load(std::memory_order_acquire)) open_guards.pop_back();
  return open_guards.empty() ? Precision::fp32 : open_guards.back().precision;
}

AutocastGuard::AutocastGuard(Precision p)
    : precision_(p), owner_(std::this_thread::get_id()), alive_(std::make_shared<std::atomic<bool>>(true)) {
  open_guards.push_back({p, alive_});
}

void AutocastGuard::close() {
  if (!open_) return;
  if (std::this_thread::get_id() != owner_) {
    fail("AutocastGuard::close: called on thread ", thread_text(std::this_thread::get_id()),
         ", but the guard was opened on thread ", thread_text(owner_),
         "; a guard belongs to the thread that opened it");
  }
  open_ = false;
  alive_->store(false, std::memory_order_release);
  open_guards.erase(
      std::remove_if(open_guards.begin(), open_guards.end(), [this](const Open& o) { return o.alive == alive_; }),
      open_guards.end());
}

AutocastGuard::~AutocastGuard() {
  if (!open_) return;
  if (std::this_thread::get_id() == owner_) {
    close();
    return;
  }
  // Another thread's stack is not ours to touch: clear the flag the opener reads, and say so.
  open_ = false;
  alive_->store(false, std::memory_order_release);
  std::cerr << "xgrad: AutocastGuard(" << precision_name(precision_) << ") opened on thread " << thread_text(owner_)
            << " was destroyed on thread " << thread_text(std::this_thread::get_id())
            << "; its scope ends on the opening thread, but a guard belongs to one thread: close it there\n";
}

}  // namespace xgrad
