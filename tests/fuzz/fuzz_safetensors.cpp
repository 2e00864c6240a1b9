// libFuzzer target for the checkpoint reader: any input must parse or raise xgrad::Error.
// Any other exception, a crash or a sanitizer report is a finding. Built and run for a bounded
// time by tests/fuzz/run_fuzz.sh (with clang's -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <string>

#include "xgrad/core/error.hpp"
#include "xgrad/core/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    const xgrad::SafetensorsContents c = xgrad::parse_safetensors(bytes, "fuzz input");
    std::size_t claimed = 0;
    for (const auto& [name, a] : c.tensors) claimed += a.size() * sizeof(float);
    if (claimed > size) __builtin_trap();  // a tensor claims more data than the input holds
  } catch (const xgrad::Error&) {
  }
  return 0;
}
