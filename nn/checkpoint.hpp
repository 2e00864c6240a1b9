// Checkpoints of a module's parameters (and, carried alongside, an optimizer's state) as
// safetensors files. Parameters are stored under their dotted names, optimizer state under
// "optimizer.<name>", so the file reads naturally from Python.
#pragma once

#include <string>

#include "xgrad/core/arg.hpp"
#include "xgrad/core/safetensors.hpp"
#include "xgrad/nn/module.hpp"

namespace xgrad::nn {

// How loading treats what it finds, e.g. LoadOptions().allow_non_finite(true).
struct LoadOptions {
  // A NaN or infinite weight is an error (naming the parameter and the flat position) unless
  // allowed: a run that diverged before its save would otherwise resume silently as NaN.
  XGRAD_ARG(bool, allow_non_finite, false);
};

// Copies of the parameter values by dotted name.
NamedArrays state_dict(const Module& module);
// Copies values into the module's parameters. Missing or unexpected names, wrong shapes and (unless
// allowed) non-finite values are errors, checked before anything is written, so on error the
// module is unchanged. States saved before the block's feed-forward norm moved
// ("blocks.N.ffn_norm.*", now "blocks.N.ffn.norm.*") load under the new names, with one line
// on stderr saying so.
void load_state_dict(Module& module, const NamedArrays& state, const LoadOptions& options = {});

// Saves atomically (see save_safetensors).
void save_checkpoint(const std::string& path, const Module& module, const NamedArrays& optimizer_state = {},
                     const Metadata& metadata = {});

struct Checkpoint {
  NamedArrays optimizer_state;  // names without the "optimizer." prefix, for Optimizer::load_state_dict
  Metadata metadata;
};

// Loads the parameters into `module` (all or nothing, checked as load_state_dict does) and returns
// the rest; errors name the file.
Checkpoint load_checkpoint(const std::string& path, Module& module, const LoadOptions& options = {});

}  // namespace xgrad::nn
