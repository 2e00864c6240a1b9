// Detaching a hook through its handle.
#include "xgrad/nn/hook.hpp"

#include <algorithm>

namespace xgrad::nn {

HookHandle& HookHandle::operator=(HookHandle&& other) noexcept {
  if (this != &other) {
    remove();
    table_ = std::move(other.table_);
    point_ = std::move(other.point_);
    id_ = other.id_;
    other.id_ = -1;
  }
  return *this;
}

void HookHandle::remove() {
  const std::shared_ptr<detail::HookTable> table = table_.lock();
  if (table && id_ >= 0) {
    std::lock_guard<std::mutex> lock(table->mutex);
    for (auto& slot : table->slots) {
      const auto removed = [this](const auto& e) { return e.id == id_; };
      const std::size_t before = slot.forward.size() + slot.backward.size();
      slot.forward.erase(std::remove_if(slot.forward.begin(), slot.forward.end(), removed), slot.forward.end());
      slot.backward.erase(std::remove_if(slot.backward.begin(), slot.backward.end(), removed), slot.backward.end());
      if (slot.forward.size() + slot.backward.size() != before) table->attached.fetch_sub(1, std::memory_order_release);
    }
  }
  table_.reset();
  id_ = -1;
}

}  // namespace xgrad::nn
