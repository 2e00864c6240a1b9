// Train a transformer language model (the classic model, or a GPT-2-style or Llama-style one:
// --arch and the option flags) on any text file (or on text from a built-in grammar) or token
// file, through any tokenizer (bytes by default), with validation, checkpoints, --resume, and
// sampling from a checkpoint (its own, or a GPT-2-layout one with --import gpt2).
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "common/files.hpp"
#include "common/memory.hpp"
#include "common/terminal.hpp"
#include "run_log.hpp"
#include "tokenizers.hpp"
#include "trainer.hpp"
#include "xgrad/inspect/svg.hpp"
#ifdef XGRAD_HAS_DISTRIBUTED
#include "mpi_sharing.hpp"
#endif
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/io/file_io.hpp"
#include "xgrad/core/kernels/blas.hpp"
#include "xgrad/core/kernels/parallel.hpp"
#include "xgrad/nn/evaluate.hpp"
#include "xgrad/text/token_file.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/hf_export.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/peft.hpp"
#include "xgrad/weights/torch_import.hpp"

using namespace lm;

namespace {

// The signal that asked the run to stop (SIGINT or SIGTERM), or 0.
volatile std::sig_atomic_t stop_signal = 0;

extern "C" void request_stop(int sig) { stop_signal = sig; }

// After the first SIGINT or SIGTERM the run ends at the end of its step, saving; a second one
// kills it at once (the handler resets itself), and the atomic save keeps the earlier file.
// The handler runs on a stack of its own: oneDNN's sgemm kernels keep data below the stack
// pointer, and a handler frame pushed there corrupted the heap (measured: 4 SIGTERMs in 6).
void install_stop_handlers() {
  static char handler_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = handler_stack;
  ss.ss_size = sizeof handler_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = request_stop;
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// --heads must divide the width of the imported model (wte.weight (V, C)), read from the header.
void check_heads(const xgrad::SafetensorsReader& file, std::size_t heads) {
  for (const xgrad::TensorInfo& t : file.tensors()) {
    if ((t.name == "wte.weight" || t.name == "transformer.wte.weight") && t.shape.size() == 2 &&
        t.shape[1] % heads != 0) {
      cli::usage_error("--heads ", heads, " does not divide the imported model's d_model ", t.shape[1], " (", t.name,
                       " is ", xgrad::shape_str(t.shape), ")");
    }
  }
}

void write_plot(const std::string& folder, const std::vector<LogEntry>& log, double unigram) {
  const bool bytes = unigram >= 0;  // a byte-level run on text
  xgrad::inspect::LinePlot plot{bytes ? "byte-level language model" : "language model",
                                "step",
                                bytes ? "loss (nats per byte)" : "loss (nats per token)",
                                {},
                                false,
                                false};
  xgrad::inspect::Series train{"train", {}, {}}, valid{"validation", {}, {}}, uni{"unigram entropy", {}, {}};
  for (const LogEntry& e : log) {
    train.x.push_back(static_cast<double>(e.step));
    train.y.push_back(e.train_loss);
    if (e.valid_loss) {
      valid.x.push_back(static_cast<double>(e.step));
      valid.y.push_back(*e.valid_loss);
    }
  }
  if (!log.empty()) uni = {"unigram entropy", {1.0, static_cast<double>(log.back().step)}, {unigram, unigram}};
  plot.series = {train, valid};
  if (bytes) plot.series.push_back(uni);
  xgrad::inspect::write_text_file(folder + "/loss.svg", xgrad::inspect::line_plot_svg(plot));
}

// An output folder as FileLock takes it, "DIR/": its lock file DIR/.lock is inside the folder, so
// that every spelling of the folder (links, "./") reaches the one lock.
std::string locked_folder(std::string folder) {
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  return folder + "/";
}

// Every path the run reads and writes, checked before any work by the one output-path rule: no
// output may be an input, a file in an input folder or another output.
// --eval-only: the model's loss on a text or a token file, as one line.
std::string evaluate_text(const std::string& checkpoint, const std::string& init_from, const TokenizerChoice& choice,
                          const std::string& text_path, const std::string& tokens_path, std::size_t seq_len,
                          std::size_t batch) {
  std::shared_ptr<xgrad::nn::LanguageModel> model;
  std::shared_ptr<const xgrad::text::Tokenizer> tokenizer;
  if (!checkpoint.empty()) {
    model = load_run_model(checkpoint, checkpoint_config(checkpoint)).model;
    tokenizer = checkpoint_tokenizer(checkpoint);
  } else {
    model = xgrad::weights::load_hf_model(init_from);
    cli::as_usage([&] { tokenizer = make_tokenizer(choice, {}); });
  }
  if (tokenizer->vocab_size() > model->options().vocab_size())
    xgrad::fail("--eval-only: the tokenizer's ", tokenizer->vocab_size(), " tokens are more than the model's ",
                model->options().vocab_size());
  std::shared_ptr<xgrad::text::TokenSource> source;
  if (!tokens_path.empty()) {
    auto file = std::make_shared<xgrad::text::TokenFile>(tokens_path);
    file->check_tokenizer(tokenizer->identity());
    source = file;
  } else {
    source = std::make_shared<xgrad::text::TokenVector>(
        tokenizer->encode_for_model(read_text(text_path, std::uint64_t{1} << 32)));
  }
  const std::size_t window = std::min(seq_len, model->options().max_len());
  const xgrad::nn::Evaluation e = xgrad::nn::evaluate(
      *model, source->size(), [&](std::size_t at, std::size_t n, std::int64_t* out) { source->read(at, n, out); },
      {window, batch});
  // The bytes of the predicted tokens' text (every token but the first), for bits per byte.
  double bytes = 0;
  std::vector<std::int64_t> chunk;
  for (std::size_t at = 1; at < source->size(); at += chunk.size()) {
    chunk.resize(std::min<std::size_t>(1 << 16, source->size() - at));
    source->read(at, chunk.size(), chunk.data());
    for (std::int64_t id : chunk) bytes += static_cast<double>(tokenizer->token_bytes(id).size());
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "eval: %zu tokens predicted in windows of %zu, %.4f nats/token, perplexity %.3f, "
                "%.4f bits/byte",
                e.tokens, window, e.nats_per_token(), e.perplexity(), bytes > 0 ? e.bits_per_byte(bytes) : 0.0);
  return line;
}

void check_files(const std::vector<xgrad::RunPath>& inputs, const std::string& checkpoint, const std::string& out,
                 const std::string& tokenizer_dir, const std::string& save_hf) {
  std::vector<xgrad::RunPath> outputs;
  if (!save_hf.empty()) {
    outputs.push_back({"--save-hf (a folder)", save_hf, true});
    // a model's files, or a LoRA run's adapter (which --resume knows only later)
    for (const char* name :
         {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "vocab.json", "merges.txt", "tokenizer.model", "adapter_config.json", "adapter_model.safetensors"})
      outputs.push_back({std::string("--save-hf's ") + name, save_hf + "/" + name});
  }
  if (!checkpoint.empty()) {
    outputs.push_back({"--checkpoint", checkpoint});
    outputs.push_back({"--checkpoint's lock file", cli::FileLock::lock_path_of(checkpoint)});
  }
  outputs.push_back({"--out (a folder)", out, true});
  outputs.push_back({"--out's log.csv", out + "/log.csv"});
  outputs.push_back({"--out's loss.svg", out + "/loss.svg"});
  outputs.push_back({"--out's lock file", cli::FileLock::lock_path_of(locked_folder(out))});
  if (!tokenizer_dir.empty()) {
    outputs.push_back({"--save-tokenizer (a folder)", tokenizer_dir, true});
    outputs.push_back({"--save-tokenizer's vocab.json", tokenizer_dir + "/vocab.json"});
    outputs.push_back({"--save-tokenizer's merges.txt", tokenizer_dir + "/merges.txt"});
    if (!xgrad::same_file(tokenizer_dir, out))  // else --out's lock covers it
      outputs.push_back({"--save-tokenizer's lock file", cli::FileLock::lock_path_of(locked_folder(tokenizer_dir))});
  }
  cli::as_usage([&] { xgrad::check_run_paths(inputs, outputs, "train_lm"); });
}

// The enum value `name` stands for in `names` (CLI11 has checked that it is one of them).
template <class E>
E value_of(const std::string& name, const Names<E>& names) {
  for (const auto& [n, e] : names) {
    if (n == name) return e;
  }
  return names.front().second;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"xgrad train_lm: a transformer language model, trained from C++.", "train_lm"};
  TrainConfig c;
  // The architecture flags' values (they override the preset, or the checkpoint's on --resume).
  TrainConfig a;
  std::string text_path, norm = "pre", checkpoint, out = "train_lm_out", prompt = "The ", import_layout;
  std::string tokens_path, valid_tokens_path, init_from, save_hf, lora;
  TokenizerChoice tokenizer_choice;
  std::string arch = "classic", norm_kind = "layer_norm", positional = "learned", activation = "gelu", init = "pytorch";
  std::size_t checkpoint_interval = 0, text_bytes = 200000, sample = 0;
  SampleOptions sampling;
  bool resume = false, quiet = false, detect_anomaly = false, checkpoint_activations = false, merge_lora = false,
       eval_only = false;
  int threads = 1;
  const auto size = cli::count(1, std::size_t{1} << 30), any = cli::count(0, std::size_t{1} << 30),
             steps = cli::count(1, cli::kMaxSteps), interval = cli::count(0, cli::kMaxSteps);
  auto names_of = [](const auto& names) {
    std::vector<std::string> out;
    for (const auto& [name, value] : names) out.push_back(name);
    return out;
  };
  app.add_option("text", text_path, "a text file to train on (default: text from a built-in grammar)")
      ->check(cli::not_empty());
  CLI::Option* arch_flag =
      app.add_option("--arch", arch,
                     "the architecture preset. classic: learned positions, LayerNorm, a GELU MLP of 4 x d-model, "
                     "biases, an untied head, PyTorch's init, weight decay on every parameter. gpt2 "
                     "(LanguageModelOptions::gpt2_style): learned positions, LayerNorm, a tanh-GELU MLP of "
                     "4 x d-model, biases, tied embeddings, GPT-2's init. llama (llama_style): rotary positions, "
                     "RMSNorm, SwiGLU of 8/3 x d-model rounded up to a multiple of 8, no biases, an untied head, "
                     "num-kv-heads half the heads (all of them when --heads is odd), GPT-2's init. gpt2 and llama "
                     "decay only the matrices (nn::split_for_weight_decay: no decay on norms, biases and "
                     "embeddings). --layers, --d-model and --heads size the preset; the flags from --d-ff to --init "
                     "override it. With --resume or --sample the checkpoint's architecture is used, and a flag given "
                     "must agree with it")
          ->check(CLI::IsMember(kArchs))
          ->capture_default_str();
  CLI::Option* layers =
      app.add_option("--layers", a.layers, "transformer blocks")->transform(size)->capture_default_str();
  CLI::Option* d_model = app.add_option("--d-model", a.d_model, "model width")->transform(size)->capture_default_str();
  CLI::Option* heads = app.add_option("--heads", a.heads, "attention heads")->transform(size)->capture_default_str();
  CLI::Option* d_ff =
      app.add_option("--d-ff", a.d_ff, "feed-forward width (0: the preset's, 4 x d-model; llama 8/3 x d-model)")
          ->transform(any)
          ->capture_default_str();
  CLI::Option* norm_flag = app.add_option("--norm", norm, "norm placement: Pre-Norm or Post-Norm")
                               ->check(CLI::IsMember({"pre", "post"}))
                               ->capture_default_str();
  CLI::Option* norm_kind_flag = app.add_option("--norm-kind", norm_kind, "every norm: LayerNorm or RMSNorm")
                                    ->check(CLI::IsMember(names_of(kNormKinds)));
  CLI::Option* norm_eps = app.add_option("--norm-eps", a.norm_eps, "the norms' eps")->check(cli::real(0, 1, true));
  CLI::Option* positional_flag =
      app.add_option("--positional", positional, "positions: a learned table, the sinusoidal one, none, or RoPE")
          ->check(CLI::IsMember(names_of(kPositionals)));
  CLI::Option* rope_theta = app.add_option("--rope-theta", a.rope_theta, "RoPE's base (--positional rotary)")
                                ->check(cli::real(0, 1e30, true));
  CLI::Option* rotary_dim =
      app.add_option("--rotary-dim", a.rotary_dim, "channels of each head RoPE turns, even (0: all of them)")
          ->transform(cli::count(0, 1 << 16));
  CLI::Option* num_kv_heads =
      app.add_option("--num-kv-heads", a.num_kv_heads, "key/value heads, dividing --heads (0: --heads)")
          ->transform(any);
  CLI::Option* qk_norm = app.add_flag("--qk-norm,!--no-qk-norm", a.qk_norm, "an RMSNorm over each head's q and k");
  CLI::Option* activation_flag = app.add_option("--activation", activation, "the feed-forward's activation")
                                     ->check(CLI::IsMember(names_of(kActivations)));
  CLI::Option* tie = app.add_flag("--tie-embeddings,!--no-tie-embeddings", a.tie_embeddings,
                                  "the head's weight is the token embedding");
  CLI::Option* bias = app.add_flag("--bias,!--no-bias", a.bias,
                                   "biases of the attention, the feed-forward and the head (not the norms)");
  CLI::Option* init_flag =
      app.add_option("--init", init, "how the weights are drawn")->check(CLI::IsMember(names_of(kInits)));
  CLI::Option* tokenizer_flag =
      app.add_option(
             "--tokenizer", tokenizer_choice.spec,
             "the tokenizer: bytes (the default, 256 ids), gpt2 DIR (GPT-2's vocab.json and merges.txt, or a "
             "tokenizer.json), bpe PATH (a byte-level BPE's folder or tokenizer.json), spm FILE (a "
             "SentencePiece .model), hf DIR (a Hugging Face tokenizer folder: tokenizer.json's whole pipeline). The "
             "checkpoint stores it; --sample and --resume use the checkpoint's")
          ->expected(1, 2)
          ->type_name("KIND [PATH]");
  app.add_option("--train-tokenizer", tokenizer_choice.train_vocab,
                 "train a byte-level BPE of this many tokens on the training text (after the split), and use it")
      ->transform(cli::count(257, 1 << 20));
  app.add_option("--save-tokenizer", tokenizer_choice.save_dir,
                 "a folder for the vocab.json and merges.txt of the tokenizer --train-tokenizer trains")
      ->check(cli::not_empty());
  app.add_option("--tokens", tokens_path,
                 "a token file (xgrad-tokenize encode) to train on instead of text; needs its --tokenizer")
      ->check(cli::not_empty());
  app.add_option("--valid-tokens", valid_tokens_path,
                 "a token file to validate on (default: the last --valid-fraction of --tokens)")
      ->check(cli::not_empty());
  app.add_option("--seq-len", c.seq_len, "context length in tokens")->transform(size)->capture_default_str();
  app.add_option("--batch", c.batch, "sequences per step")->transform(size)->capture_default_str();
  app.add_option("--steps", c.steps, "training steps (with --resume: may extend the run)")
      ->transform(steps)
      ->capture_default_str();
  app.add_option("--lr", c.lr, "peak AdamW learning rate")->check(cli::real(0, 1e6, true))->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "learning rate at the end of the cosine decay")
      ->check(cli::real(0, 1e6))
      ->capture_default_str();
  app.add_option("--warmup", c.warmup, "linear warm-up steps (fewer than --steps)")
      ->transform(interval)
      ->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay")
      ->check(cli::real(0, 1e6))
      ->capture_default_str();
  app.add_option("--clip", c.clip, "clip the global gradient norm (0: off)")
      ->check(cli::real(0, 1e30))
      ->capture_default_str();
  app.add_option("--dropout", c.dropout, "dropout")->check(cli::real(0, 0.999))->capture_default_str();
  app.add_option("--seed", c.seed, "seed")->transform(cli::seed())->capture_default_str();
  cli::add_threads(app, threads);
  xgrad::Precision precision = xgrad::Precision::fp32;
  cli::add_precision(app, precision);
  app.add_option("--valid-fraction", c.valid_fraction, "share of the text held out")
      ->check(cli::real(0, 1, true))
      ->capture_default_str();
  app.add_option("--eval-interval", c.eval_interval, "steps between validations (0: at the end only)")
      ->transform(interval)
      ->capture_default_str();
  app.add_option("--eval-batches", c.eval_batches, "validation batches")->transform(size)->capture_default_str();
  app.add_option("--text-bytes", text_bytes, "size of the built-in text")->transform(size)->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "checkpoint file (.safetensors) to write, resume or sample from")
      ->check(cli::not_empty());
  CLI::Option* interval_flag =
      app.add_option("--checkpoint-interval", checkpoint_interval, "steps between checkpoints (0: at the end only)")
          ->transform(interval);
  app.add_flag("--resume", resume, "continue training from --checkpoint");
  app.add_option("--init-from", init_from,
                 "fine-tune the model of a Hugging Face folder (config.json and model.safetensors of any family "
                 "weights::load_hf_model reads: llama, qwen2, qwen3, mistral, phi3, gpt_neox, gpt2, gemma2, "
                 "gemma3_text); its config.json is the architecture (no architecture flag applies), and its "
                 "tokenizer.json the tokenizer unless --tokenizer names another")
      ->check(cli::not_empty());
  app.add_option("--save-hf", save_hf,
                 "after training, also write the model as a Hugging Face folder of the family that describes it "
                 "(weights::save_hf_model), with the tokenizer's files when it is a Hugging Face tokenizer (hf)")
      ->check(cli::not_empty());
  CLI::Option* freeze_flag =
      app.add_option("--freeze", c.freeze,
                     "leave the parameters this name pattern selects untrained (may repeat): a glob over xgrad's names "
                     "(blocks.0.*) or, for a model a Hugging Face family describes, that family's "
                     "(model.layers.0.*), \"re:\" and a regular expression, or a last name (embed_tokens.weight)")
          ->expected(1)
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  CLI::Option* lora_flag =
      app.add_option("--lora", lora,
                     "train LoRA adapters instead of the model, every other parameter frozen: "
                     "r=8,alpha=16[,dropout=0.05][,rslora],targets=q_proj,v_proj (targets last; module names as "
                     "--freeze's patterns)")
          ->check(cli::not_empty());
  app.add_option("--grad-accum", c.grad_accum,
                 "run each step's --batch as this many micro-batches of --batch / N rows: the same update, the "
                 "activations of one micro-batch")
      ->transform(cli::count(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--checkpoint-activations", checkpoint_activations,
               "keep only each block's input and run the block again in backward: the same losses, less memory, "
               "about one more forward's time");
  app.add_flag("--merge-lora", merge_lora,
               "with --lora and --save-hf: fold the adapters into the weights and write the whole model (without it "
               "--save-hf writes the adapters alone, as PEFT saves them)");
  app.add_flag("--eval-only", eval_only,
               "train nothing: print the loss (nats per token, perplexity, bits per byte) of --checkpoint's model, or "
               "--init-from's, on the text or --tokens, in windows of --seq-len, --batch at a time");
  CLI::Option* sample_flag =
      app.add_option("--sample", sample,
                     "generate this many tokens from --checkpoint, without training (at --precision)")
          ->transform(cli::count(1, 1 << 20));
  app.add_option("--import", import_layout,
                 "with --sample: --checkpoint holds another layout (gpt2: Hugging Face's GPT-2 names; give --heads, "
                 "and --tokenizer gpt2 DIR unless its vocabulary is 256 bytes)")
      ->check(cli::not_empty());
  app.add_option("--prompt", prompt, "prompt for sampling (and for the sample after training)")
      ->check(cli::not_empty())
      ->capture_default_str();
  app.add_option("--temperature", sampling.temperature, "sampling temperature (0: greedy)")
      ->check(cli::real(0, 1e6))
      ->capture_default_str();
  app.add_option("--top-k", sampling.top_k, "sample among the k most likely tokens (0: all)")
      ->transform(cli::count(0, 1 << 24));
  app.add_option("--top-p", sampling.top_p,
                 "sample among the fewest most likely tokens whose probability reaches p (1: all)")
      ->check(cli::real(0, 1, true))
      ->capture_default_str();
  app.add_option("--min-p", sampling.min_p,
                 "sample among the tokens at least this fraction as likely as the most likely one (0: all)")
      ->check(cli::real(0, 1))
      ->capture_default_str();
  app.add_option("--repetition-penalty", sampling.repetition_penalty,
                 "divide the positive logits of the tokens already in the text by this, and multiply the negative "
                 "ones (1: none)")
      ->check(cli::real(0, 1e6, true))
      ->capture_default_str();
  app.add_option("--stop", sampling.stop, "end the sample at the first token that completes this text (repeatable)")
      ->allow_extra_args(false)
      ->check(cli::not_empty());
  app.add_flag("--ignore-eos", sampling.ignore_eos,
               "sample past the tokenizer's end-of-text token (by default the sample ends there)");
  app.add_option("--out", out, "folder for the log and the loss curve")->capture_default_str();
  app.add_flag("--detect-anomaly", detect_anomaly,
               "check every op for NaN and Inf, to name the op behind a non-finite loss (slow)");
  app.add_flag("--quiet", quiet, "no progress line");
  // Under mpirun every rank runs this program; rank 0 alone prints and writes files.
  std::shared_ptr<Sharing> sharing = std::make_shared<Sharing>();
  std::function<void(int)> end_job;
#ifdef XGRAD_HAS_DISTRIBUTED
  std::shared_ptr<MpiSharing> mpi;
  if (xgrad::distributed::launched_by_mpi()) {
    xgrad::distributed::ProcessGroup* world = nullptr;  // an Error for a bad XGRAD_DIST_TIMEOUT
    if (const int code = cli::run("train_lm", [&] { world = &xgrad::distributed::ProcessGroup::world(); })) return code;
    auto& group = *world;
    mpi = std::make_shared<MpiSharing>(group);
    sharing = mpi;
    // Another rank may be waiting in a collective: one rank's failure ends them all.
    if (group.distributed()) end_job = [&group](int code) { group.abort(code); };
  }
#endif
  // After MPI is up: a rank that stops here (a usage error, --help) ends the whole job.
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  sampling.precision = precision;
  if (lora_flag->count() > 0) {
    if (const int code = cli::run("train_lm", [&] { cli::as_usage([&] { parse_lora(lora, c); }); })) return code;
  }
  a.norm = norm == "pre" ? xgrad::nn::Norm::pre : xgrad::nn::Norm::post;
  a.arch = arch;
  a.norm_kind = value_of(norm_kind, kNormKinds);
  a.positional = value_of(positional, kPositionals);
  a.activation = value_of(activation, kActivations);
  a.init = value_of(init, kInits);
  // Each architecture flag, and the field it sets; --d-ff 0 keeps the preset's width.
  const std::vector<std::pair<CLI::Option*, std::function<void(TrainConfig&)>>> arch_flags = {
      {arch_flag, [&](TrainConfig& t) { t.arch = a.arch; }},
      {layers, [&](TrainConfig& t) { t.layers = a.layers; }},
      {d_model, [&](TrainConfig& t) { t.d_model = a.d_model; }},
      {heads, [&](TrainConfig& t) { t.heads = a.heads; }},
      {d_ff, [&](TrainConfig& t) { t.d_ff = a.d_ff ? a.d_ff : t.d_ff; }},
      {norm_flag, [&](TrainConfig& t) { t.norm = a.norm; }},
      {norm_kind_flag, [&](TrainConfig& t) { t.norm_kind = a.norm_kind; }},
      {norm_eps, [&](TrainConfig& t) { t.norm_eps = a.norm_eps; }},
      {positional_flag, [&](TrainConfig& t) { t.positional = a.positional; }},
      {rope_theta, [&](TrainConfig& t) { t.rope_theta = a.rope_theta; }},
      {rotary_dim, [&](TrainConfig& t) { t.rotary_dim = a.rotary_dim; }},
      {num_kv_heads, [&](TrainConfig& t) { t.num_kv_heads = a.num_kv_heads; }},
      {qk_norm, [&](TrainConfig& t) { t.qk_norm = a.qk_norm; }},
      {activation_flag, [&](TrainConfig& t) { t.activation = a.activation; }},
      {tie, [&](TrainConfig& t) { t.tie_embeddings = a.tie_embeddings; }},
      {bias, [&](TrainConfig& t) { t.bias = a.bias; }},
      {init_flag, [&](TrainConfig& t) { t.init = a.init; }},
  };
  // The flags given, over `base`.
  auto with_flags = [&](TrainConfig base) {
    for (const auto& [option, set] : arch_flags) {
      if (option->count() > 0) set(base);
    }
    return base;
  };
  // A checkpoint of an --init-from run holds the imported architecture: no flag applies to it.
  auto refuse_arch_flags = [&](const std::string& why) {
    for (const auto& [option, set] : arch_flags) {
      if (option->count() > 0) cli::usage_error(option->get_name(), " does not apply: ", why);
    }
  };
  c.layers = a.layers, c.d_model = a.d_model, c.heads = a.heads;  // the preset's sizes (also --import's --heads)
  const int rank = sharing->rank();
  const bool lead = rank == 0;
  quiet = quiet || !lead;
  const std::string program = sharing->size() > 1 ? "train_lm (rank " + std::to_string(rank) + ")" : "train_lm";

  int stopped_by = 0;  // the signal that ended the run before its last step
  const int code = cli::run(
      program,
      [&] {
#ifdef XGRAD_HAS_DISTRIBUTED
    // Every rank must take the same path (train, sample, import) with the same settings.
    if (mpi) mpi->check_command_line(app, {"--threads", "--quiet", "--detect-anomaly"});
#endif
    xgrad::set_num_threads(threads);
    // A mode flag never falls back to another mode that writes files.
    if (sample_flag->count() > 0 && resume)
      cli::usage_error("--sample reads --checkpoint and trains nothing: it cannot --resume");
    if (interval_flag->count() > 0 && sample_flag->count() > 0)
      cli::usage_error("--checkpoint-interval is for training; --sample writes no checkpoint");
    if (interval_flag->count() > 0 && checkpoint.empty())
      cli::usage_error("--checkpoint-interval needs --checkpoint: there is no file to write");
    if (sample > 0 && checkpoint.empty()) cli::usage_error("--sample needs --checkpoint");
    if (sample > 0 && !text_path.empty())
      cli::usage_error("--sample reads no training text: '", text_path, "' would be unused");
    if (!tokens_path.empty() && !text_path.empty())
      cli::usage_error("--tokens is the training data: the text '", text_path, "' would be unused");
    if (!valid_tokens_path.empty() && tokens_path.empty())
      cli::usage_error("--valid-tokens is for training from --tokens");
    // With --resume, --train-tokenizer trains again on the same text: resume checks that the
    // tokenizer is the checkpoint's.
    if (tokenizer_choice.train_vocab > 0 && (sample > 0 || !tokens_path.empty()))
      cli::usage_error("--train-tokenizer trains on the training text: ",
                       sample > 0 ? "--sample reads none" : "--tokens is already tokenized");
    if (sample > 0 && import_layout.empty() && tokenizer_flag->count() > 0)
      cli::usage_error("--sample uses the tokenizer the checkpoint stores: drop --tokenizer");
    if (!tokenizer_choice.save_dir.empty() && tokenizer_choice.train_vocab == 0)
      cli::usage_error("--save-tokenizer saves the tokenizer --train-tokenizer trains");
    if (!init_from.empty()) {
      if (sample > 0) cli::usage_error("--init-from starts a run from a folder; --sample reads --checkpoint");
      if (resume) cli::usage_error("--init-from starts a run from a folder; --resume continues --checkpoint's");
      if (!import_layout.empty()) cli::usage_error("--init-from and --import: one source of weights");
      if (tokenizer_choice.train_vocab > 0)
        cli::usage_error("--train-tokenizer would give --init-from's model another vocabulary than it was trained on");
      for (const auto& [option, set] : arch_flags) {
        if (option->count() > 0)
          cli::usage_error(option->get_name(), " does not apply to --init-from: '", init_from,
                           "/config.json' fixes the architecture");
      }
      if (!tokenizer_choice.given()) {
        std::error_code ec;
        if (!std::filesystem::exists(init_from + "/tokenizer.json", ec))
          cli::usage_error("--init-from '", init_from,
                           "' holds no tokenizer.json: name the tokenizer with --tokenizer");
        tokenizer_choice.spec = {"hf", init_from};
      }
    }
    if (!save_hf.empty() && sample > 0) cli::usage_error("--save-hf writes the trained model; --sample trains nothing");
    if (resume && (lora_flag->count() > 0 || freeze_flag->count() > 0))
      cli::usage_error(lora_flag->count() > 0 ? "--lora" : "--freeze",
                       " does not apply to --resume: the checkpoint's run fixes what trains");
    if (sample > 0 && (lora_flag->count() > 0 || !c.freeze.empty() || checkpoint_activations))
      cli::usage_error(
          "--lora, --freeze and --checkpoint-activations are for training; --sample reads the "
          "checkpoint's adapters");
    if (!valid_tokens_path.empty() && xgrad::same_file(valid_tokens_path, tokens_path))
      cli::usage_error("--valid-tokens '", valid_tokens_path, "' is the same file as --tokens '", tokens_path,
                       "': the run would validate on its training data; leave out --valid-tokens to hold out the "
                       "last --valid-fraction of --tokens");
    if (sample == 0 && !eval_only) {  // --sample and --eval-only only read
      std::vector<xgrad::RunPath> inputs;
      if (!text_path.empty()) inputs.push_back({"the training text", text_path});
      if (!tokens_path.empty()) inputs.push_back({"--tokens", tokens_path});
      if (!valid_tokens_path.empty()) inputs.push_back({"--valid-tokens", valid_tokens_path});
      if (tokenizer_choice.spec.size() == 2) inputs.push_back({"--tokenizer", tokenizer_choice.spec[1], true});
      if (!init_from.empty()) inputs.push_back({"--init-from", init_from, true});
      check_files(inputs, checkpoint, out, tokenizer_choice.save_dir, save_hf);
    }
    if (!import_layout.empty()) {
      if (import_layout != "gpt2") cli::usage_error("--import: unknown layout '", import_layout, "' (known: gpt2)");
      if (sample == 0) cli::usage_error("--import is for --sample: it reads a checkpoint to sample from");
      if (heads->count() == 0)
        cli::usage_error("--import gpt2 needs --heads: the number of attention heads is not in the file");
      for (CLI::Option* o : {arch_flag, norm_kind_flag, norm_eps, positional_flag, rope_theta, rotary_dim, num_kv_heads,
                             qk_norm, activation_flag, tie, bias, init_flag}) {
        if (o->count() > 0)
          cli::usage_error(o->get_name(), " does not apply to --import gpt2: the GPT-2 layout fixes the architecture");
      }
    }
    if (eval_only) {
      if (sample > 0 || resume || !save_hf.empty() || lora_flag->count() > 0 || freeze_flag->count() > 0 ||
          !import_layout.empty())
        cli::usage_error(
            "--eval-only trains nothing: --sample, --resume, --save-hf, --lora, --freeze and --import do "
            "not apply");
      if (checkpoint.empty() == init_from.empty())
        cli::usage_error("--eval-only evaluates the model of --checkpoint or of --init-from: give one");
      if (text_path.empty() == tokens_path.empty())
        cli::usage_error("--eval-only reads the text file or --tokens: give one");
      if (!checkpoint.empty() && tokenizer_flag->count() > 0)
        cli::usage_error("--eval-only uses the tokenizer --checkpoint stores: drop --tokenizer");
      if (lead)
        std::printf(
            "%s\n",
            evaluate_text(checkpoint, init_from, tokenizer_choice, text_path, tokens_path, c.seq_len, c.batch).c_str());
      return;
    }
    if (sample > 0 && !import_layout.empty()) {
      if (checkpoint.empty()) cli::usage_error("--sample needs --checkpoint");
      check_heads(xgrad::SafetensorsReader(checkpoint), c.heads);
      std::shared_ptr<const xgrad::text::Tokenizer> tokenizer;
      cli::as_usage([&] { tokenizer = make_tokenizer(tokenizer_choice, {}); });
      // Read tensor by tensor into the model: the peak is the model's size, not the file's twice.
      if (const auto options = xgrad::weights::gpt2_options(checkpoint, c.heads);
          options.vocab_size() != tokenizer->vocab_size()) {
        cli::usage_error("--import gpt2: '", checkpoint, "' has a vocabulary of ", options.vocab_size(),
                         " tokens and the ", tokenizer->kind(), " tokenizer ", tokenizer->vocab_size(),
                         options.vocab_size() == 50257 ? ": give --tokenizer gpt2 DIR with GPT-2's files" : "");
      }
      const std::shared_ptr<xgrad::nn::LanguageModel> model = xgrad::weights::load_gpt2(checkpoint, c.heads);
      if (lead) sample_text(*model, *tokenizer, prompt, sample, sampling, c.seed);
      return;
    }
    if (sample > 0) {
      if (checkpoint.empty()) cli::usage_error("--sample needs --checkpoint");
      const TrainConfig saved = checkpoint_config(checkpoint);
      if (saved.imported)
        refuse_arch_flags("--sample: '" + checkpoint + "' fine-tunes --init-from '" + saved.init_from + "'");
      // The model the file's options describe (older files: its config's); the architecture
      // flags given with --sample must agree with it.
      const auto loaded = load_run_model(checkpoint, saved);
      TrainConfig base = saved;
      base.d_ff = model_options(saved).d_ff();  // not 4 x an asked --d-model
      const TrainConfig asked = with_flags(base);
      if (asked.arch != saved.arch)
        cli::usage_error("--sample: '", checkpoint, "' holds an --arch ", saved.arch, " model, not ", asked.arch);
      cli::as_usage([&] {
        xgrad::weights::check_model_options(loaded.model->options(), model_options(asked),
                                            "--sample: '" + checkpoint + "'");
      });
      const auto tokenizer = checkpoint_tokenizer(checkpoint);
      // An imported model's embedding may have more rows than its tokenizer has tokens (padded).
      if (saved.imported ? tokenizer->vocab_size() > loaded.model->options().vocab_size()
                         : tokenizer->vocab_size() != loaded.model->options().vocab_size())
        xgrad::fail("--sample: '", checkpoint, "' holds a model of ", loaded.model->options().vocab_size(),
                    " tokens and a tokenizer of ", tokenizer->vocab_size());
      if (lead) sample_text(*loaded.model, *tokenizer, prompt, sample, sampling, c.seed);
      return;
    }
    std::string text;
    std::shared_ptr<const xgrad::text::Tokenizer> tokenizer;
    cli::as_usage([&] {
      if (resume && checkpoint.empty()) xgrad::fail("--resume needs --checkpoint");
      // The architecture: the checkpoint's on --resume (a flag given that differs is named by
      // resume), else the preset's; then the flags given.
      if (resume) {
        const TrainConfig saved = checkpoint_config(checkpoint);
        copy_architecture(saved, c);
        copy_fine_tuning(saved, c);
        if (c.imported)
          refuse_arch_flags("--resume: '" + checkpoint + "' fine-tunes --init-from '" + c.init_from + "'");
      } else if (!init_from.empty()) {
        apply_init_from(c, init_from);
      } else {
        apply_arch(c, arch);
      }
      c = with_flags(c);
      if (c.positional != xgrad::nn::Positional::rotary) {
        for (CLI::Option* o : {rope_theta, rotary_dim}) {
          if (o->count() > 0)
            xgrad::fail(o->get_name(), " is for --positional rotary; this model's positions are ",
                        kPositionals[static_cast<std::size_t>(c.positional)].first);
        }
      }
      validate(c);
      if (merge_lora && (c.lora_rank == 0 || save_hf.empty()))
        xgrad::fail("--merge-lora folds --lora's adapters into the model --save-hf writes: give both");
      if (!save_hf.empty()) xgrad::weights::hf_config_json(model_options(c));  // a model no family describes
      // Every output is checked before training, so a long run is never lost to a typo.
      if (lead) xgrad::prepare_output_dir(out, "train_lm: --out");  // first: the checkpoint may go in it
      cli::check_output_files({{"--out's log.csv", out + "/log.csv"}, {"--out's loss.svg", out + "/loss.svg"}});
      if (lead && !checkpoint.empty()) xgrad::check_writable_file(checkpoint, "train_lm: --checkpoint");
    });
    // One writer per checkpoint and per output folder: a second run on the same file or folder is
    // refused while this one lives, before it reads its text.
    std::optional<cli::FileLock> lock, out_lock, tokenizer_lock;
    if (lead && !checkpoint.empty()) lock.emplace(checkpoint, "train_lm: --checkpoint");
    if (lead) out_lock.emplace(locked_folder(out), "train_lm: --out");
    if (lead && !tokenizer_choice.save_dir.empty() && !xgrad::same_file(tokenizer_choice.save_dir, out)) {
      cli::as_usage([&] { xgrad::prepare_output_dir(tokenizer_choice.save_dir, "train_lm: --save-tokenizer"); });
      tokenizer_lock.emplace(locked_folder(tokenizer_choice.save_dir), "train_lm: --save-tokenizer");
    }
    cli::as_usage([&] {
      // The text is held about four times, and its tokens in 2 or 4 bytes each.
      const double max_text = cli::memory_limit_bytes() / 8;
      if (!tokens_path.empty()) {
        // A token file is read a window at a time, not whole.
      } else if (text_path.empty()) {
        cli::check_memory(8.0 * static_cast<double>(text_bytes),
                          "the built-in text of --text-bytes " + std::to_string(text_bytes));
        text = grammar_text(text_bytes, 12345);
      } else {
        text = read_text(text_path, static_cast<std::uint64_t>(max_text));
      }
    });
    Corpus corpus;
    cli::as_usage([&] {
      // --resume continues with the checkpoint's tokenizer unless one is named (then the two must agree).
      if (resume && !tokenizer_choice.given()) {
        tokenizer = checkpoint_tokenizer(checkpoint);
      } else {
        tokenizer = make_tokenizer(tokenizer_choice, training_part(text, c.valid_fraction), resume);
      }
      // The sample after training starts from the prompt: found empty now, not after the run.
      if (tokenizer->encode(prompt).empty())
        xgrad::fail("--prompt '", prompt, "' encodes to no tokens with the ", tokenizer->kind(),
                    " tokenizer: the sample after training would start from nothing; give another --prompt");
      c.vocab_size = tokenizer->vocab_size();
      validate(c);
      corpus = tokens_path.empty()
                   ? split(text, c.valid_fraction, c.seq_len, tokenizer)
                   : token_corpus(tokens_path, valid_tokens_path, c.valid_fraction, c.seq_len, tokenizer);
    });
    // The unigram bar is in nats per byte: it is drawn only for a byte-level run on text.
    const double unigram = tokenizer->kind() == "bytes" && tokens_path.empty() ? unigram_entropy(text) : -1.0;
    DataSource source;
    cli::as_usage([&] {
      source = !tokens_path.empty() ? identify_file(tokens_path, tokenizer->vocab_size())
                                    : identify(text_path.empty() ? "built-in grammar" : text_path, text);
    });
    std::unique_ptr<Trainer> trainer;
#ifdef XGRAD_HAS_DISTRIBUTED
    if (mpi) {
      nlohmann::json settings = {{"text", source.describe()},
                                 {"--resume", resume},
                                 {"--checkpoint", utf8_or_escaped(checkpoint)},
                                 {"tokenizer", xgrad::text::describe(tokenizer->identity())}};
      const nlohmann::json config = c.to_json();
      for (const auto& [key, value] : config.items()) {
        std::string flag = "--" + key;
        std::replace(flag.begin(), flag.end(), '_', '-');
        settings[flag] = value;
      }
      mpi->check_agreement(settings);
    }
#endif
    cli::as_usage([&] {
      trainer = std::make_unique<Trainer>(c, std::move(corpus), source, sharing);
      trainer->set_precision(precision);
      trainer->set_checkpoint_activations(checkpoint_activations);
      if (resume) trainer->resume(checkpoint);
      if (!resume && c.imported) trainer->load_imported_weights();
      trainer->check_saveable();
      // A LoRA run's adapters must have a place in PEFT's format before the first step.
      if (!save_hf.empty() && c.lora_rank > 0 && !merge_lora)
        xgrad::weights::check_peft_adapter(trainer->model(), {"", c.init_from});
    });
    std::optional<xgrad::AnomalyGuard> anomaly;
    if (detect_anomaly) anomaly.emplace();
    if (!lead) {
      trainer->run(c.steps, {}, checkpoint, checkpoint_interval);
      trainer->validation_loss();  // a collective: every rank takes part
      return;
    }
    if (sharing->size() > 1)
      std::printf("data-parallel on %d processes, %zu sequences each\n", sharing->size(), c.batch / sharing->size());
    if (tokens_path.empty() && unigram >= 0) {
      std::printf("text: %s, %zu bytes, unigram entropy %.3f nats/byte\n",
                  text_path.empty() ? "built-in grammar" : text_path.c_str(), text.size(), unigram);
    } else if (tokens_path.empty()) {
      std::printf("text: %s, %zu bytes\n", text_path.empty() ? "built-in grammar" : text_path.c_str(), text.size());
    } else {
      std::printf("tokens: %s\n", source.describe().c_str());
    }
    if (tokenizer->kind() != "bytes")
      std::printf("tokenizer: %s\n", xgrad::text::describe(tokenizer->identity()).c_str());
    std::printf("model: %s%zu layers, d_model %zu, %zu heads, %zu parameters; %zu steps of %zu x %zu %s%s\n",
                c.arch == "classic" ? "" : ("--arch " + c.arch + ", ").c_str(), c.layers, c.d_model, c.heads,
                trainer->model().num_parameters(), c.steps, c.batch, c.seq_len,
                tokenizer->kind() == "bytes" ? "bytes" : "tokens",
                resume ? (", resuming at step " + std::to_string(trainer->step())).c_str() : "");
    if (c.lora_rank > 0 || !c.freeze.empty()) {
      std::size_t trained = 0;
      for (const auto& [n, p] : trainer->model().named_trainable_parameters()) trained += p.size();
      std::printf("trained: %zu of %zu parameters (%.2f%%)%s; optimizer state %.1f MiB\n", trained,
                  trainer->model().num_parameters(),
                  100.0 * static_cast<double>(trained) / static_cast<double>(trainer->model().num_parameters()),
                  c.lora_rank > 0 ? ", LoRA adapters" : "", 8.0 * static_cast<double>(trained) / (1 << 20));
    }
    if (precision == xgrad::Precision::bf16) {
      std::printf("precision: bf16 products (%s), fp32 accumulation, fp32 weights and optimizer\n",
                  xgrad::blas::bf16_path_name(xgrad::blas::bf16_path()).c_str());
    }

    RunLog run_log(out, resume ? std::optional<std::size_t>(trainer->step()) : std::nullopt);
    viz::ProgressLine line(quiet, c.eval_interval ? c.eval_interval : std::max<std::size_t>(c.steps / 10, 1));
    float last_valid = -1;
    const std::size_t first = trainer->step();
    auto on_step = [&](const LogEntry& e) {
      if (e.valid_loss) last_valid = *e.valid_loss;
      const double done = static_cast<double>(e.step - first);
      const double left = e.seconds / std::max(done, 1.0) * static_cast<double>(c.steps - e.step);
      char text_line[200], valid_text[32] = "  -  ";
      if (last_valid >= 0) std::snprintf(valid_text, sizeof valid_text, "%.3g", static_cast<double>(last_valid));
      std::snprintf(text_line, sizeof text_line, "step %5zu/%zu  train %.3f  valid %s  %6.0f tokens/s  %s left", e.step,
                    c.steps, static_cast<double>(e.train_loss), valid_text,
                    done * static_cast<double>(c.batch * c.seq_len) / std::max(e.seconds, 1e-9),
                    viz::duration(left).c_str());
      line.update(e.step, c.steps, text_line);
      run_log.append(e);
    };
    // One process: a stop request ends the run cleanly at a step's end. Ranks of a data-parallel
    // run would stop at different steps, so under mpirun a signal ends the job as before.
    if (sharing->size() == 1) {
      install_stop_handlers();
      trainer->set_stop_request([] { return stop_signal != 0; });
    }
    try {
      trainer->run(c.steps, on_step, checkpoint, checkpoint_interval);
    } catch (const xgrad::Error&) {
      line.finish();
      try {
        write_plot(out, run_log.entries(), unigram);  // the steps before the failure, to look at
      } catch (const xgrad::Error&) {
        // The failure itself is the message worth reading (often the same full disk).
      }
      throw;
    }
    line.finish();
    anomaly.reset();
    if (stop_signal != 0 && trainer->step() < c.steps) {
      stopped_by = stop_signal;
      write_plot(out, run_log.entries(), unigram);
      std::fprintf(stderr, "train_lm: stopped by %s after step %zu of %zu; log: %s/log.csv%s\n",
                   stop_signal == SIGINT ? "SIGINT" : "SIGTERM", trainer->step(), c.steps, out.c_str(),
                   checkpoint.empty() ? ""
                                      : ("; '" + checkpoint + "' holds step " + std::to_string(trainer->step()) +
                                         ": --resume continues")
                                            .c_str());
      return;
    }
    if (!checkpoint.empty()) trainer->save(checkpoint);
    if (!save_hf.empty() && c.lora_rank > 0 && !merge_lora) {
      xgrad::weights::save_peft_adapter(trainer->model(), save_hf, {"", c.init_from});
    } else if (!save_hf.empty()) {
      if (merge_lora) xgrad::nn::merge_lora(trainer->model());  // after the checkpoint, which keeps the adapters
      xgrad::weights::HfExportOptions e;
      const auto& spec = tokenizer_choice.spec;
      if (spec.size() == 2 && spec[0] == "hf") e.tokenizer_dir = spec[1];
      xgrad::weights::save_hf_model(trainer->model(), save_hf, e);
    }

    const float valid = trainer->validation_loss();
    if (tokenizer->kind() == "bytes" && tokens_path.empty()) {
      std::printf("validation loss %.3f nats/byte (unigram entropy %.3f)\n", static_cast<double>(valid), unigram);
    } else {
      std::printf("validation loss %.3f nats/token, %.4f bits/byte\n", static_cast<double>(valid),
                  trainer->bits_per_byte(valid));
    }
    write_plot(out, run_log.entries(), unigram);
    std::printf("log: %s/log.csv, curve: %s/loss.svg%s%s\n", out.c_str(), out.c_str(),
                checkpoint.empty() ? "" : ", checkpoint: ", checkpoint.c_str());
    std::printf("sample: ");
    sample_text(trainer->model(), *tokenizer, prompt, 120, sampling, c.seed);
      },
      end_job);
  // Stopped by a signal: with the files written and the lock let go, end as that signal would.
  if (stopped_by != 0) {
    std::fflush(stdout);
    std::signal(stopped_by, SIG_DFL);
    std::raise(stopped_by);
  }
  return code;
}
