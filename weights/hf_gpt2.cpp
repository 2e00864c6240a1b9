// The GPT-2 family (model_type "gpt2": GPT-2 small to XL, DistilGPT2): Pre-Norm LayerNorms with
// biases, learned positions, a GELU MLP of n_inner (4 C), biases everywhere, the head tied to the
// embedding by default. Its Conv1D weights are (in, out), the transpose of a Linear's; c_attn's
// columns hold q, k and v in turn. Formulas as in transformers 4.57's
// models/gpt2/modeling_gpt2.py.
//
// GPT-2's three dropouts (embd_pdrop on the embeddings, attn_pdrop on the attention weights,
// resid_pdrop on each sublayer's output, 0.1 each in the published configs) act in training only;
// they are read and the model loads with dropout 0 (its eval forward is GPT-2's). A fine-tune
// sets xgrad's own dropout, which sits on the attention weights and the MLP's hidden activations.
#include <string>

#include "xgrad/weights/detail/hf_config.hpp"

namespace xgrad::weights::detail {

namespace {

// The activation_function values and the activation each is.
nn::Activation read_gpt2_activation(const ConfigReader& r) {
  const std::string act = r.text("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") return nn::Activation::gelu_tanh;
  if (act == "gelu") return nn::Activation::gelu;
  if (act == "relu") return nn::Activation::relu;
  r.fail_field("field \"activation_function\" is \"" + act +
               "\"; only \"gelu_new\", \"gelu_pytorch_tanh\", \"gelu\" and \"relu\" are supported");
}

// The causal-mask buffers older versions saved: h.N.attn.bias and h.N.attn.masked_bias.
bool is_mask_buffer(const std::string& name) {
  const auto ends_with = [&](const std::string& s) {
    return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return (name.compare(0, 2, "h.") == 0 || name.compare(0, 14, "transformer.h.") == 0) &&
         (ends_with(".attn.bias") || ends_with(".attn.masked_bias"));
}

}  // namespace

HfLayout gpt2_layout(const ConfigReader& r) {
  const std::size_t V = r.count("vocab_size"), C = r.count("n_embd"), H = r.count("n_head");
  const std::size_t L = r.count("n_layer"), P = r.count("n_positions");
  const std::size_t F = r.count("n_inner", 4 * C, true);
  const float eps = r.positive_float("layer_norm_epsilon", false, 1e-5f);
  const nn::Activation act = read_gpt2_activation(r);
  for (const char* dropout : {"embd_pdrop", "attn_pdrop", "resid_pdrop", "summary_first_dropout"}) {
    r.fraction(dropout, 0.0);  // training only (see above)
  }
  r.require("scale_attn_weights", true, "attention without the 1 / sqrt(D) scale");
  r.require("scale_attn_by_inverse_layer_idx", false, "scaling each layer's attention by 1 / (layer + 1)");
  r.require("add_cross_attention", false, "cross-attention layers");
  r.flag("reorder_and_upcast_attn", false);  // float32 throughout here: the same products
  r.find("n_ctx", true);                     // older configs' copy of n_positions, unused
  for (const char* head : {"summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels"}) {
    r.find(head, true);  // GPT2DoubleHeadsModel's multiple-choice head
  }
  const bool tied = r.flag("tie_word_embeddings", true);
  if (C % H != 0) r.fail_field("n_head " + std::to_string(H) + " does not divide n_embd " + std::to_string(C));

  HfLayout l;
  l.options = nn::LanguageModelOptions::gpt2_style(V, C, H, L)
                  .d_ff(F)
                  .max_len(P)
                  .dropout(0.f)
                  .norm_eps(eps)
                  .activation(act)
                  .tie_embeddings(tied)
                  .head_bias(false);
  l.optional_prefix = "transformer.";
  l.before = {{"transformer.wte.weight", "tok_emb.weight", {V, C}},
              {"transformer.wpe.weight", "pos_emb.weight", {P, C}}};
  l.after = {{"transformer.ln_f.weight", "final_norm.weight", {C}}, {"transformer.ln_f.bias", "final_norm.bias", {C}}};
  if (!tied) l.after.push_back({"lm_head.weight", "head.weight", {V, C}});
  l.head = "lm_head.weight";
  l.buffer = is_mask_buffer;
  l.layer = [=](std::size_t n) {
    const std::string h = "transformer.h." + std::to_string(n) + ".", b = "blocks." + std::to_string(n) + ".";
    const std::string qkv = h + "attn.c_attn.", proj = h + "attn.c_proj.";
    const Shape qkv_w{C, 3 * C}, qkv_b{3 * C};
    std::vector<TensorMap> ex;
    for (const auto& [norm, to] : {std::pair{"ln_1", "attn.norm"}, std::pair{"ln_2", "ffn.norm"}}) {
      ex.push_back({h + norm + ".weight", b + to + ".weight", {C}});
      ex.push_back({h + norm + ".bias", b + to + ".bias", {C}});
    }
    const char* parts[] = {"attn.w_q", "attn.w_k", "attn.w_v"};
    for (std::size_t i = 0; i < 3; ++i) {
      ex.push_back({qkv + "weight", b + parts[i] + ".weight", {C, C}, qkv_w, {{i * C, C}}, true});
      ex.push_back({qkv + "bias", b + parts[i] + ".bias", {C}, qkv_b, {{i * C, C}}});
    }
    ex.push_back({proj + "weight", b + "attn.w_o.weight", {C, C}, {}, {}, true});
    ex.push_back({proj + "bias", b + "attn.w_o.bias", {C}});
    ex.push_back({h + "mlp.c_fc.weight", b + "ffn.linear1.weight", {F, C}, {C, F}, {}, true});
    ex.push_back({h + "mlp.c_fc.bias", b + "ffn.linear1.bias", {F}});
    ex.push_back({h + "mlp.c_proj.weight", b + "ffn.linear2.weight", {C, F}, {F, C}, {}, true});
    ex.push_back({h + "mlp.c_proj.bias", b + "ffn.linear2.bias", {C}});
    return ex;
  };
  return l;
}

nlohmann::json gpt2_config(const nn::LanguageModelOptions& o) {
  const nn::Activation a = o.activation();
  const char* act = a == nn::Activation::gelu ? "gelu" : a == nn::Activation::relu ? "relu" : "gelu_new";
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", o.vocab_size()},
          {"n_embd", o.d_model()},
          {"n_head", o.num_heads()},
          {"n_layer", o.num_layers()},
          {"n_positions", o.max_len()},
          {"n_inner", o.d_ff()},
          {"layer_norm_epsilon", f32_json(o.norm_eps())},
          {"activation_function", act},
          {"tie_word_embeddings", o.tie_embeddings()},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"resid_pdrop", 0.0},
          {"torch_dtype", "float32"}};
}

}  // namespace xgrad::weights::detail
