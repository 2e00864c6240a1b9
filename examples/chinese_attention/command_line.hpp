// The example's options, shared by main() and the test that feeds them bad input.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "trainer.hpp"

namespace zh {

struct CommandLine {
  TrainOptions train;
  std::string out = "chinese_attention_out";
  int threads = 1;
  bool quiet = false;
};

// --steps --batch --lr --seed --threads --out --quiet, each through a strict cli:: validator.
void add_options(CLI::App& app, CommandLine& command_line);

// Before any work: the settings together, and that --out can hold the images. Throws
// cli::UsageError naming the option.
void check_before_run(const CommandLine& command_line);

}  // namespace zh
