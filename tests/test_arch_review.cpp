// Hostile inputs to the architecture options (docs/architectures.md) and the parts they touch:
// RoPE's frequencies, the comparison of stored and asked options, tied parameters under their
// second name, group learning rates past float32, positions with a KV cache, the import of a
// TransformerEncoderLayer, and weights whose size passes size_t. Each case pins an input that once
// crashed, gave NaN or inf silently, or was refused wrongly; tests/BAD_INPUT.md has the rows.
//
// Shapes: B batch, T length, C d_model, H heads, D = C / H, V vocabulary.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/weights/checkpoint.hpp"
#include "xgrad/weights/hf_import.hpp"
#include "xgrad/weights/model_options_json.hpp"
#include "xgrad/weights/torch_import.hpp"

#include "test_files.hpp"

using namespace xgrad;
using Catch::Matchers::Contains;

namespace {

// V 11, C 16, 1 layer, D 4 (H 4).
nn::LanguageModelOptions small() { return nn::LanguageModelOptions(11, 16, 4, 1).d_ff(8).max_len(8).dropout(0.f); }

// A copy to change option by option (the setters change the options they are called on).
template <class Options>
Options copy(const Options& o) {
  return o;
}

std::vector<std::string> fields(const std::vector<weights::OptionsDifference>& diff) {
  std::vector<std::string> out;
  for (const auto& d : diff) out.push_back(d.field);
  return out;
}

}  // namespace

TEST_CASE("bad input: a rope_theta whose frequencies or angles pass float32 is refused, not NaN",
          "[nn][arch][rotary][bad_input][bug]") {
  // theta 1e-45 with rotary_dim 16: 1 / theta^(14/16) is past float32, so position 0 gave 0 * inf = NaN
  // in every logit. The model is refused before it is built, from code and from a file's options.
  const auto tiny = nn::LanguageModelOptions(11, 16, 1, 1)
                        .d_ff(8)
                        .max_len(8)
                        .dropout(0.f)
                        .positional(nn::Positional::rotary)
                        .rope_theta(1e-45f);
  Generator gen(1);
  CHECK_THROWS_WITH(nn::LanguageModel(tiny, gen),
                    Contains("LanguageModel: rope_theta 1.4013e-45 with rotary_dim 16 gives the frequency inf, and "
                             "the angle at position max_len - 1 = 7 passes float32"));
  CHECK_THROWS_WITH(weights::language_model_options_from_json(weights::to_json(tiny), "who"),
                    Contains("who: LanguageModel: rope_theta 1.4013e-45 with rotary_dim 16"));
  // A finite top frequency (about 2e33 for theta 1e-38) passes float32 only at a far position.
  const auto small_theta = nn::LanguageModelOptions(11, 16, 1, 1).d_ff(8).positional(nn::Positional::rotary);
  CHECK_NOTHROW(nn::LanguageModel::check(copy(small_theta).rope_theta(1e-38f).max_len(8)));
  CHECK_THROWS_WITH(nn::LanguageModel::check(copy(small_theta).rope_theta(1e-38f).max_len(1000000)),
                    Contains("the angle at position max_len - 1 = 999999 passes float32"));
  // A Llama config.json with such a theta (float32 holds 1e-45 as a denormal) is refused by its reader.
  testing::TempDir dir("xgrad_arch_review");
  testing::write_bytes(dir.file("config.json"),
                       R"({"vocab_size": 11, "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,)"
                       R"( "num_attention_heads": 1, "max_position_embeddings": 8, "rms_norm_eps": 1e-5,)"
                       R"( "rope_theta": 1e-45})");
  CHECK_THROWS_WITH(weights::llama_options(dir.path),
                    Contains("llama_options: '" + dir.file("config.json") +
                             "' describes a model xgrad refuses: LanguageModel: rope_theta 1.4013e-45"));
  // The op itself, for a caller of rotary_embedding.
  const Tensor x(xt::ones<float>({1, 2, 16}));
  CHECK_THROWS_WITH(rotary_embedding(x, 1, IndexArray{0, 1}, 1e-45f, 16),
                    Contains("rotary_embedding: theta 1.4013e-45 with rotary_dim 16 gives the frequency inf and, at "
                             "position 1, an angle float32 cannot hold"));
  // A finite frequency times a far position: theta 1e-38, rotary_dim 16 (frequency about 2e33).
  const IndexArray far = {0, 1000000};
  CHECK_THROWS_WITH(rotary_embedding(x, 1, far, 1e-38f, 16),
                    Contains("at position 1000000, an angle float32 cannot hold"));
  // Extreme but representable thetas still turn: 1e30 and 1e-30 give finite values.
  for (float theta : {1e30f, 1e-30f}) {
    const Array y = rotary_embedding(x, 1, IndexArray{0, 7}, theta, 16).value();
    for (float v : y) REQUIRE(std::isfinite(v));
  }
}

TEST_CASE("architectures: two spellings of one model, or fields that build nothing, are no difference",
          "[nn][arch][options][bug]") {
  // Each pair builds the same parameters; the stored and asked options were refused as contradicting.
  CHECK(weights::architecture_differences(small(), small().num_kv_heads(4)).empty());
  CHECK(
      weights::architecture_differences(small(), small().rotary_dim(2).rope_theta(5e5f)).empty());  // learned positions
  const auto rope = small().positional(nn::Positional::rotary);
  CHECK(weights::architecture_differences(rope, copy(rope).rotary_dim(4)).empty());  // 0 is the head size 4
  CHECK(weights::architecture_differences(small().tie_embeddings(true), small().tie_embeddings(true).head_bias(false))
            .empty());
  CHECK(weights::architecture_differences(small().norm_kind(nn::NormKind::rms_norm),
                                          small().norm_kind(nn::NormKind::rms_norm).norm_bias(false))
            .empty());
  CHECK(weights::architecture_differences(small().norm_affine(false), small().norm_affine(false).norm_bias(false))
            .empty());
  // Real differences are still named, in to_json's order.
  CHECK(fields(weights::architecture_differences(rope, copy(rope).rotary_dim(2).num_kv_heads(2))) ==
        std::vector<std::string>{"num_kv_heads", "rotary_dim"});
  CHECK(fields(weights::architecture_differences(rope, copy(rope).rope_theta(5e5f))) ==
        std::vector<std::string>{"rope_theta"});
  CHECK(fields(weights::architecture_differences(small(), nn::LanguageModelOptions(11, 16, 2, 1).d_ff(8).max_len(8))) ==
        std::vector<std::string>{"num_heads"});  // num_kv_heads 0 on both sides follows num_heads
  CHECK(fields(weights::architecture_differences(small(), small().head_bias(false))) ==
        std::vector<std::string>{"head_bias"});
  CHECK(fields(weights::architecture_differences(small(), small().norm_bias(false))) ==
        std::vector<std::string>{"norm_bias"});

  // A checkpoint saved with num_kv_heads 4 loads with the options that leave it 0.
  Generator gen(2);
  nn::LanguageModel lm(small().num_kv_heads(4), gen);
  const std::string path = "test_arch_review_kv.safetensors";
  weights::save_checkpoint(path, lm);
  const weights::LoadedLanguageModel loaded = weights::load_language_model(path, small());
  CHECK(loaded.model->options().num_kv_heads() == 4);
  CHECK_THROWS_WITH(weights::load_language_model(path, small().num_kv_heads(2)),
                    Contains("the stored model options contradict the ones asked for: num_kv_heads 4 in the file, 2 "
                             "asked"));
  std::remove(path.c_str());
}

TEST_CASE("architectures: a tied parameter answers to its second name, as PyTorch's state_dict writes it",
          "[nn][arch][tied][bug]") {
  Generator gen(3);
  nn::LanguageModel tied(small().tie_embeddings(true), gen);
  CHECK(tied.parameter("head.weight").is_same(tied.tok_emb->weight));

  // A state holding both names with one value (torch.nn.Module.state_dict of a tied model) loads.
  NamedArrays state = weights::state_dict(tied);
  const Array emb = tied.tok_emb->weight.value();
  for (auto& [name, a] : state) {
    if (name == "tok_emb.weight") a = emb * 2.f;
  }
  state.emplace_back("head.weight", emb * 2.f);
  const weights::LoadResult r = weights::load_state_dict(tied, state);
  CHECK(r.unexpected_keys.empty());
  CHECK(tied.tok_emb->weight.value() == Array(emb * 2.f));

  // The second name alone loads the parameter.
  NamedArrays by_head;
  for (const auto& [name, a] : state) {
    if (name != "head.weight") by_head.emplace_back(name == "tok_emb.weight" ? "head.weight" : name, a);
  }
  for (auto& [name, a] : by_head) {
    if (name == "head.weight") a = emb * 3.f;
  }
  weights::load_state_dict(tied, by_head);
  CHECK(tied.tok_emb->weight.value() == Array(emb * 3.f));

  // Two different values for one matrix: refused, strict or not, and nothing is loaded.
  for (auto& [name, a] : state) {
    if (name == "head.weight") a(4, 1) += 1.f;
  }
  for (bool strict : {true, false}) {
    CHECK_THROWS_WITH(weights::load_state_dict(tied, state, weights::LoadOptions().strict(strict)),
                      Contains("load_state_dict: 'head.weight' is the parameter 'tok_emb.weight' (tied), and the "
                               "state gives the two names different values (first at flat position 65)"));
    CHECK(tied.tok_emb->weight.value() == Array(emb * 3.f));
  }
  // A second name of another shape is a shape error, as for the first name.
  state.back().second = xt::zeros<float>({3, 16});
  CHECK_THROWS_WITH(weights::load_state_dict(tied, state),
                    Contains("load_state_dict: parameter 'head.weight' has shape (3, 16) in the state but (11, 16) in "
                             "the module"));
}

TEST_CASE("bad input: a learning rate whose group rate passes float32 is refused, not inf",
          "[optim][groups][bad_input][bug]") {
  Tensor a(xt::ones<float>({2}), true), b(xt::ones<float>({2}), true);
  optim::Adam opt({optim::ParamGroup({{"a", a}}), optim::ParamGroup({{"b", b}}).lr(10.f)}, optim::AdamOptions(1.f));
  CHECK_THROWS_WITH(opt.set_lr(1e38f),
                    Contains("Adam: group 1: learning rate 1e+38 times the group's factor 10 is inf, past float32"));
  CHECK(opt.lr() == 1.f);
  CHECK(opt.group_lr(1) == 10.f);
  // A group rate over a tiny optimizer rate: the factor itself passes float32.
  opt.set_lr(1e-38f);
  CHECK_THROWS_WITH(opt.set_group_lr(1, 10.f),
                    Contains("Adam: group 1: learning rate 10 over the optimizer's 1e-38 is a factor past 1e30"));
  CHECK(opt.group_lr(1) == 1e-38f * 10.f);
  // The same factor asked by a group's own lr when the optimizer is built.
  CHECK_THROWS_WITH(
      optim::Adam({optim::ParamGroup({{"a", a}}), optim::ParamGroup({{"b", b}}).lr(10.f)}, optim::AdamOptions(1e-38f)),
      Contains("Adam: group 1: learning rate 10 over the optimizer's 1e-38 is a factor past 1e30"));
}

TEST_CASE("a KVCache without positions counts from 0, as positions 0 .. T - 1 given without one do",
          "[nn][arch][rotary][cache][gemm]") {
  Generator gen(4);
  const nn::MultiHeadAttention attn(nn::MultiHeadAttentionOptions(8, 2).rotary(true).dropout(0.f), gen);
  const Tensor x(gen.normal({1, 3, 8}, 0.f, 1.f));
  nn::KVCache cache;
  const IndexArray counted = {0, 1, 2};
  NoGradGuard no_grad;
  const Array cached = attn.forward(x, nn::AttentionMask{}, &cache).output.value();
  const Array given = attn.forward(x, nn::AttentionMask{}, nullptr, &counted).output.value();
  CHECK(cached == given);
  CHECK(cache.length() == 3);
  CHECK_FALSE(cache.positions.has_value());
}

TEST_CASE("bad input: a TransformerEncoderLayer state for a block torch's layer cannot be is refused, naming why",
          "[nn][arch][import][bad_input][bug]") {
  const auto classic = nn::TransformerBlockOptions(8, 2).d_ff(16).dropout(0.f);
  // Checked before the state is read: an empty one is refused for the options alone.
  CHECK_THROWS_WITH(weights::from_torch_encoder_layer({}, copy(classic).num_kv_heads(1)),
                    Contains("from_torch_encoder_layer: torch.nn.TransformerEncoderLayer has LayerNorms with weights "
                             "and biases, every bias, one key/value head per head, no QK-norm, no rotary positions "
                             "and an ungated activation; the options ask for num_kv_heads 1"));
  nn::TransformerBlockOptions llama = copy(classic).activation(nn::Activation::swiglu).num_kv_heads(1);
  llama.norm_options(nn::NormOptions().kind(nn::NormKind::rms_norm));
  llama.attention(nn::MultiHeadAttentionOptions(llama.attention()).qk_norm(true).qkv_bias(false));
  CHECK_THROWS_WITH(weights::from_torch_encoder_layer({}, llama),
                    Contains("the options ask for norm_kind rms_norm, a projection without a bias, num_kv_heads 1, "
                             "qk_norm, a gated activation"));
  // The classic options pass the check and reach the state's own checks.
  CHECK_THROWS_WITH(weights::from_torch_encoder_layer({}, classic), !Contains("torch.nn.TransformerEncoderLayer has"));
}

TEST_CASE("bad input: layers whose weights pass size_t or the memory left are refused before they are filled",
          "[nn][arch][memory][bad_input][bug]") {
  const std::size_t big = std::size_t{1} << 32;
  // (2^32, 2^32) counts 2^64 elements, which wrapped to 0: a weight of that shape holding nothing.
  CHECK_THROWS_WITH(nn::Linear(big, big, false),
                    Contains("Generator::uniform: an array of shape (4294967296, 4294967296) needs"));
  CHECK_THROWS_WITH(nn::Embedding(big, big),
                    Contains("Generator::normal: an array of shape (4294967296, 4294967296) needs"));
  // A LanguageModel of those sizes (about 1.1e20 values) is refused before its first layer, its size counted whole.
  CHECK_THROWS_WITH(nn::LanguageModel(nn::LanguageModelOptions(big, big, 1, 1).d_ff(1)),
                    Contains("LanguageModel: building the model (1 blocks, 1106804") &&
                        Contains(" float32 values) needs") && !Contains("(1 blocks, 0 float32"));
  // The sinusoidal table was written past its end.
  CHECK_THROWS_WITH(nn::SinusoidalPositionalEncoding(big, big),
                    Contains("SinusoidalPositionalEncoding: a table of shape (4294967296, 4294967296) needs"));
  // 2^32 tiny blocks (about 34 KiB each): refused before the first one, not built until the process is killed.
  CHECK_THROWS_WITH(nn::LanguageModel(nn::LanguageModelOptions(11, 2, 1, big).d_ff(2)),
                    Contains("LanguageModel: building the model (4294967296 blocks, ") &&
                        Contains("this process can still allocate"));
  // A gated feed-forward 2^40 wide: an Error, not std::bad_alloc.
  CHECK_THROWS_WITH(
      nn::FeedForward(nn::FeedForwardOptions(16, std::size_t{1} << 40).activation(nn::Activation::swiglu)),
      Contains("Generator::uniform: an array of shape (1099511627776, 16) needs") &&
          Contains("this process can still allocate"));
}
