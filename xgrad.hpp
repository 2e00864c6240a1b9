/// @file
/// Everything the xgrad library offers, in one include: `#include "xgrad/xgrad.hpp"` is the
/// one umbrella header, for core/, nn/, optim/ and inspect/. Data-parallel training on MPI is the
/// separate library xgrad::distributed, with its own headers under xgrad/distributed/.
#pragma once

#include "xgrad/core/arg.hpp"
#include "xgrad/core/autograd/gradcheck.hpp"
#include "xgrad/core/autograd/gradient_ready.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/io/memory.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/core/io/utf8.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/activation_cache.hpp"
#include "xgrad/inspect/attention_viewer.hpp"
#include "xgrad/inspect/head_patterns.hpp"
#include "xgrad/inspect/hook_names.hpp"
#include "xgrad/inspect/logit_lens.hpp"
#include "xgrad/inspect/patching.hpp"
#include "xgrad/inspect/patching_sweep.hpp"
#include "xgrad/inspect/residual_decomposition.hpp"
#include "xgrad/inspect/steering.hpp"
#include "xgrad/inspect/svg.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/checkpoint.hpp"
#include "xgrad/nn/head_importance.hpp"
#include "xgrad/nn/hook.hpp"
#include "xgrad/nn/init.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/llama_import.hpp"
#include "xgrad/nn/module.hpp"
#include "xgrad/nn/options.hpp"
#include "xgrad/nn/probe.hpp"
#include "xgrad/nn/random_stream.hpp"
#include "xgrad/nn/residual.hpp"
#include "xgrad/nn/torch_import.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/nn/weight_decay.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/clip.hpp"
#include "xgrad/optim/finite.hpp"
#include "xgrad/optim/optimizer.hpp"
#include "xgrad/optim/schedule.hpp"
#include "xgrad/optim/sgd.hpp"
// Tokenizers and token files: declared here, defined in the xgrad::text library (link it to use them).
#include "xgrad/text/bpe_trainer.hpp"
#include "xgrad/text/bpe_vocabulary.hpp"
#include "xgrad/text/byte_level_bpe.hpp"
#include "xgrad/text/bytes_tokenizer.hpp"
#include "xgrad/text/gpt2_byte_encoding.hpp"
#include "xgrad/text/gpt2_files.hpp"
#include "xgrad/text/load_tokenizer.hpp"
#include "xgrad/text/pretokenizer.hpp"
#include "xgrad/text/sentencepiece_tokenizer.hpp"
#include "xgrad/text/token_batches.hpp"
#include "xgrad/text/token_file.hpp"
#include "xgrad/text/token_source.hpp"
#include "xgrad/text/tokenizer.hpp"

/// @namespace xgrad
/// All of xgrad's API. Directly in it: tensors and the tape, the differentiable ops, gradient
/// checking, random numbers, threads, errors and file I/O (the headers under core/; matrix
/// products are in xgrad::blas). Modules are in xgrad::nn, optimizers in xgrad::optim, tools that
/// look inside a model in xgrad::inspect, tokenizers and token files in xgrad::text, and
/// data-parallel training in xgrad::distributed.
