// Training a byte-level LanguageModel: AdamW with warm-up and cosine decay, gradient clipping,
// periodic validation, and checkpoints that resume exactly (model, optimizer state, step, and
// the data generator's state; the model's dropout streams are seeded by seed, rank and step).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "corpus.hpp"
#include "xgrad/core/autograd/precision.hpp"
#include "xgrad/core/io/safetensors.hpp"
#include "xgrad/nn/lora.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/schedule.hpp"
#include "xgrad/weights/checkpoint.hpp"

namespace lm {

struct TrainConfig {
  // model
  std::size_t layers = 2, d_model = 128, heads = 4, d_ff = 0, seq_len = 64;  // d_ff 0: 4 * d_model
  std::size_t vocab_size = 256;                                              // the tokenizer's (256: bytes)
  float dropout = 0.1f;
  xgrad::nn::Norm norm = xgrad::nn::Norm::pre;
  // The preset the architecture started from (see apply_arch), which also picks the weight-decay
  // rule: "classic" decays every parameter; "gpt2" and "llama" decay the matrices only
  // (nn::split_for_weight_decay). The fields after it are the architecture the preset and the
  // flags give, as LanguageModelOptions names them; their defaults are the classic model's.
  std::string arch = "classic";
  xgrad::nn::NormKind norm_kind = xgrad::nn::NormKind::layer_norm;
  float norm_eps = 1e-5f;
  xgrad::nn::Positional positional = xgrad::nn::Positional::learned;
  float rope_theta = 10000.f;
  std::size_t rotary_dim = 0;    // 0: the whole head
  std::size_t num_kv_heads = 0;  // 0: heads
  bool qk_norm = false;
  xgrad::nn::Activation activation = xgrad::nn::Activation::gelu;
  bool tie_embeddings = false;
  bool bias = true;  // the biases of w_q, w_k, w_v, w_o, the feed-forward and the head
  xgrad::nn::Init init = xgrad::nn::Init::pytorch;
  // --init-from: a Hugging Face folder (any family weights::load_hf_model reads) whose model the run
  // fine-tunes. `imported` is its architecture (arch "imported", which decays the matrices only): it
  // replaces the fields from d_ff on, and layers, d_model and heads repeat its sizes for messages.
  std::string init_from;
  std::optional<xgrad::nn::LanguageModelOptions> imported;
  // fine-tuning: the parameters trained. `freeze`: name patterns (nn::freeze; xgrad's names or, for
  // a model a Hugging Face family describes, that family's) of parameters left as they are.
  // lora_rank > 0: LoRA adapters on the Linear modules lora_targets names, every other parameter
  // frozen (nn::apply_lora).
  std::vector<std::string> freeze;
  std::size_t lora_rank = 0;
  float lora_alpha = 8.f, lora_dropout = 0.f;
  bool lora_rslora = false;
  std::vector<std::string> lora_targets;
  // optimization; each step's batch runs as grad_accum micro-batches of batch / grad_accum rows
  std::size_t batch = 16, steps = 600, warmup = 60, grad_accum = 1;
  float lr = 3e-3f, min_lr = 3e-4f, weight_decay = 0.1f, clip = 1.f;  // clip 0: none
  // data and evaluation
  double valid_fraction = 0.1;
  std::size_t eval_interval = 100, eval_batches = 8;  // eval_interval 0: validate at the end only
  std::uint64_t seed = 0;

  nlohmann::json to_json() const;
  static TrainConfig from_json(const nlohmann::json& j);
};

// Throws xgrad::Error naming an impossible or absurd setting (by its flag), including one whose
// model and batches could not fit in this process's memory.
void validate(const TrainConfig& config);

// The value names of the architecture's enum options, as the flags and the config spell them.
template <class E>
using Names = std::vector<std::pair<std::string, E>>;
extern const Names<xgrad::nn::NormKind> kNormKinds;
extern const Names<xgrad::nn::Positional> kPositionals;
extern const Names<xgrad::nn::Activation> kActivations;
extern const Names<xgrad::nn::Init> kInits;
extern const std::vector<std::string> kArchs;  // classic, gpt2, llama

// Sets config.arch to `arch` and the architecture fields (d_ff, norm and the fields after arch)
// to that preset's for config.d_model and config.heads: "classic" the defaults above (the model
// train_lm trained before it had presets), "gpt2" LanguageModelOptions::gpt2_style, "llama"
// LanguageModelOptions::llama_style with num_kv_heads half the heads (all of them when the
// number of heads is odd). An unknown name throws naming --arch.
void apply_arch(TrainConfig& config, const std::string& arch);
// Sets config to fine-tune the model of the Hugging Face folder `dir` (--init-from): init_from,
// imported (its config.json, read by weights::hf_model_options), arch "imported" and its sizes.
void apply_init_from(TrainConfig& config, const std::string& dir);

// Copies every architecture field (layers, d_model, heads, d_ff, norm, arch and the fields after
// it) from `from` into `to`.
void copy_architecture(const TrainConfig& from, TrainConfig& to);
// Copies what trains (freeze and the lora fields) from `from` into `to`.
void copy_fine_tuning(const TrainConfig& from, TrainConfig& to);
// The LoRA options of the config (lora_rank > 0).
xgrad::nn::LoraOptions lora_options(const TrainConfig& config);
// Parses --lora's value, "r=8,alpha=16,dropout=0.05,rslora,targets=q_proj,v_proj" (targets last:
// every later comma-separated item is a target), into config's lora fields; an Error names what is wrong.
void parse_lora(const std::string& value, TrainConfig& config);
// The model's parameter names in the Hugging Face family that describes it (none for a model no
// family describes), for --freeze and --lora patterns.
xgrad::nn::NameAliases hf_aliases(const xgrad::nn::LanguageModelOptions& options);
// Adds the config's LoRA adapters (drawn from gen) and freezes its --freeze patterns.
void apply_fine_tuning(xgrad::nn::LanguageModel& model, const TrainConfig& config, xgrad::Generator& gen);

// The bytes a run trains on, identified by content so that --resume can refuse other data.
struct DataSource {
  std::string name;                    // the file's path, or "built-in grammar"
  std::uint64_t bytes = 0, fnv1a = 0;  // size and 64-bit FNV-1a hash of the bytes
  nlohmann::json to_json() const;
  std::string describe() const;  // "'a.txt' (1234 bytes, FNV-1a 0123abcd...)"
};
DataSource identify(const std::string& name, const std::string& text);
// The same for a token file, read in pieces (it is never held whole). The same pass checks every
// id of the file against `vocab_size`: an id outside it is an Error naming the file, the token's
// position and byte, the id and the vocabulary size, before any training step.
DataSource identify_file(const std::string& path, std::uint64_t vocab_size);

struct LogEntry {
  std::size_t step = 0;  // 1-based: the step just taken
  float train_loss = 0, lr = 0;
  std::optional<float> valid_loss;
  double seconds = 0;
};

// How a run shares its work with other processes. The default is one process; a data-parallel
// run (train_lm under mpirun) passes its own: the trainer then trains on rows
// [rank * batch / size, (rank + 1) * batch / size) of every global batch, averages the losses it
// reports, and expects wrap() to make backward average the gradients over the processes.
class Sharing {
 public:
  virtual ~Sharing() = default;
  virtual int rank() const { return 0; }
  virtual int size() const { return 1; }
  virtual double mean(double v) { return v; }  // over the processes
  virtual void wrap(xgrad::nn::Module&) {}     // once, after the model is built
};

class Trainer {
 public:
  Trainer(const TrainConfig& config, Corpus corpus, DataSource data = {}, std::shared_ptr<Sharing> sharing = {});

  // Continues from a checkpoint written by save(). Every setting but `steps` must match the
  // checkpoint's (an error names the flags that differ), and so must the data. A larger `steps`
  // extends the run: the learning-rate schedule stays the one the run started with, so steps
  // past its end train at min_lr.
  void resume(const std::string& checkpoint);
  // Trains until `step` steps have been taken in all (including resumed ones). `on_step` sees
  // every log entry; a checkpoint is written every `checkpoint_interval` steps when both are set.
  // A checkpoint due after step K is written only once step K's weights have given a finite loss
  // (step K + 1's forward pass, or step K's validation), so the file never holds diverged weights.
  // A NaN or infinite loss or gradient stops the run with an Error naming the step, before the
  // optimizer touches the weights, and saying which step `checkpoint` holds (or that this run
  // wrote none).
  void run(std::size_t step, const std::function<void(const LogEntry&)>& on_step = {},
           const std::string& checkpoint = "", std::size_t checkpoint_interval = 0);
  // The precision of each step's forward, loss and backward, and of validation (fp32 unless set):
  // under bf16 they run inside an AutocastGuard, closed before clipping and the optimizer step.
  // Not part of the config, so never in a checkpoint: a run may resume at another precision.
  void set_precision(xgrad::Precision precision) { precision_ = precision; }
  // Activation checkpointing of every block (nn::LanguageModel::set_checkpoint_activations): the
  // same losses, less memory, about one more forward's time. Not in the config either.
  void set_checkpoint_activations(bool on) { model_->set_checkpoint_activations(on); }
  xgrad::Precision precision() const { return precision_; }
  // Asked after every step: true ends run() there (a checkpoint given is then written, checked
  // by a validation pass like any other). For a graceful stop on SIGINT or SIGTERM.
  void set_stop_request(std::function<bool()> stop) { stop_request_ = std::move(stop); }
  float validation_loss();  // nats per token
  // A validation loss as bits per byte of the text its targets decode to, so that models with
  // different tokenizers compare.
  double bits_per_byte(float validation_loss) const;
  // Writes a checkpoint (on rank 0 only; the other ranks' state is the same).
  void save(const std::string& path);
  // Before the first step: throws the Error a save would meet on its metadata (a name that is not
  // UTF-8), so a long run is never lost at its end.
  void check_saveable() const;
  // The weights of the Hugging Face folder config.init_from, before the first step of a new run.
  void load_imported_weights();

  std::size_t step() const { return step_; }
  const std::vector<LogEntry>& log() const { return log_; }
  xgrad::nn::LanguageModel& model() { return *model_; }
  const xgrad::optim::AdamW& optimizer() const { return *optimizer_; }
  const TrainConfig& config() const { return config_; }
  const xgrad::text::Tokenizer& tokenizer() const { return *corpus_.tokenizer; }

 private:
  xgrad::text::TokenBatch share(const xgrad::text::TokenBatch& global) const;  // this rank's rows
  xgrad::Metadata metadata(const std::string& data_state) const;
  void save(const std::string& path, const std::string& data_state);
  std::string checkpoint_note(const std::string& checkpoint) const;  // what the file holds, for a stop
  TrainConfig config_;
  std::shared_ptr<Sharing> sharing_;
  std::size_t schedule_steps_;  // the schedule's length: the first run's steps, kept on resume
  DataSource source_;
  Corpus corpus_;
  std::vector<xgrad::text::TokenBatch> valid_;
  double valid_tokens_per_byte_ = 1;  // over the global validation batches
  xgrad::Generator init_, data_;      // the same on every rank: every rank draws the whole batch
  std::unique_ptr<xgrad::nn::LanguageModel> model_;
  std::unique_ptr<xgrad::optim::AdamW> optimizer_;
  xgrad::optim::LrSchedule schedule_;
  std::size_t step_ = 0;
  std::vector<LogEntry> log_;
  std::function<bool()> stop_request_;
  std::optional<std::size_t> saved_step_;  // the step in the checkpoint written (or resumed from) by this run
  xgrad::Precision precision_ = xgrad::Precision::fp32;  // of each step and of validation; not in checkpoints
};

xgrad::nn::LanguageModelOptions model_options(const TrainConfig& config);

// The model of a train_lm checkpoint with its LoRA adapters, when the run had them (config: the
// checkpoint's, checkpoint_config), built and loaded.
xgrad::weights::LoadedLanguageModel load_run_model(const std::string& checkpoint, const TrainConfig& config);

// Reads the training config stored in a checkpoint (to rebuild its model for sampling), refusing
// one that validate() refuses.
TrainConfig checkpoint_config(const std::string& checkpoint);

// The tokenizer a checkpoint stores (the bytes tokenizer for one written before train_lm had
// tokenizers); an Error names the file when its tokenizer cannot be read.
std::shared_ptr<const xgrad::text::Tokenizer> checkpoint_tokenizer(const std::string& checkpoint);

// The estimated bytes a training step of this config needs (parameters, optimizer state,
// activations and their gradients).
double training_bytes(const TrainConfig& config);

}  // namespace lm
