// The safetensors file format for named float32 arrays: an 8-byte little-endian header length,
// a JSON header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the row-major data. Python's safetensors (or a few
// lines of numpy) opens these files.
#pragma once

#include <map>
#include <string>

#include "xgrad/core/tensor.hpp"

namespace xgrad {

using Metadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  NamedArrays tensors;  // in file order (by data offset)
  Metadata metadata;
};

// Writes atomically (write_file_atomically: a temporary file in the same folder, synced, then
// renamed over `path`), so a crash mid-save leaves any earlier file at `path` intact. First removes
// the temporaries that killed saves of the same path left (remove_stale_temporaries).
void save_safetensors(const std::string& path, const NamedArrays& tensors, const Metadata& metadata = {});

// Reads and checks everything (sizes, JSON, dtypes, shapes, offsets in range, no holes or
// overlaps); any problem is an Error naming the file and what is wrong. A folder, a device or a
// fifo is refused before reading, and a header that promises more than the file holds before the
// data is read. Also removes stale temporaries of `path`, as save_safetensors does.
SafetensorsContents load_safetensors(const std::string& path);

// The same checks on bytes already in memory; `what` names them in errors.
SafetensorsContents parse_safetensors(const std::string& bytes, const std::string& what = "buffer");

}  // namespace xgrad
