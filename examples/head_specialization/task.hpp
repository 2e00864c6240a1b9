// The example's task, the examples' shared shift task (common/shift_task.hpp), named here.
#pragma once

#include "common/shift_task.hpp"

namespace headspec {
using tasks::kIgnore;
using tasks::make_batch;
using tasks::ShiftBatch;
using tasks::ShiftTask;
}  // namespace headspec
