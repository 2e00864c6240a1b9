// LoRA adapters: the adapter's forward, adding adapters to a model by name, merging them.
#include "xgrad/nn/lora.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"

namespace xgrad::nn {

float LoraOptions::scaling() const {
  const auto r = static_cast<float>(rank_);
  return rslora_ ? alpha_ / std::sqrt(r) : alpha_ / r;
}

void LoraOptions::check(const char* who) const {
  if (rank_ == 0) fail(who, ": LoRA rank 0 must be at least 1");
  if (!(std::isfinite(alpha_) && alpha_ > 0.f)) fail(who, ": LoRA alpha ", alpha_, " must be finite and > 0");
  if (!(dropout_ >= 0.f && dropout_ < 1.f)) fail(who, ": LoRA dropout ", dropout_, " is outside [0, 1)");
}

LoRA::LoRA(std::size_t in, std::size_t out, const LoraOptions& options, Generator& gen)
    : RandomStream(gen), options_(options) {
  options.check("LoRA");
  const std::size_t r = options.rank();
  if (r > std::min(in, out))
    fail("LoRA: rank ", r, " is larger than the layer (in ", in, ", out ", out, "): at most ", std::min(in, out));
  const float bound = 1.f / std::sqrt(static_cast<float>(in));  // kaiming_uniform(a = sqrt(5)) on (r, in)
  A = register_parameter("A", Tensor(gen.uniform({r, in}, -bound, bound)));
  B = register_parameter("B", Tensor::zeros({out, r}));
  merged_ = register_buffer("merged", Array(xt::zeros<float>(Shape{})));
  declare_hook_points({"hidden", "out"});
}

Tensor LoRA::forward(const Tensor& x) const {
  const Tensor in = dropout(x, options_.dropout(), is_training(), generator());
  const Tensor hidden = hook("hidden", linear(in, A));  // (..., r)
  return hook("out", mul(linear(hidden, B), options_.scaling()));
}

Tensor LoRA::delta() const { return mul(matmul(B, A), options_.scaling()); }

std::vector<std::pair<std::string, Linear*>> lora_layers(Module& model) {
  std::vector<std::pair<std::string, Linear*>> out;
  for (auto& [name, m] : model.named_modules()) {
    auto* l = dynamic_cast<Linear*>(m);
    if (l && l->lora) out.emplace_back(name, l);
  }
  return out;
}

std::vector<std::string> apply_lora(Module& model, const LoraOptions& options, Generator& gen,
                                    const NameAliases& aliases) {
  const char* who = "apply_lora";
  options.check(who);
  if (options.targets().empty()) fail(who, ": LoRA targets are empty: name the Linear modules to adapt");
  const auto modules = model.named_modules();
  std::vector<std::string> names;
  NameAliases module_aliases;  // "blocks.0.attn.w_q" -> "model.layers.0.self_attn.q_proj"
  for (const auto& [name, m] : modules) {
    if (name.empty()) continue;
    names.push_back(name);
    const auto a = aliases.find(name + ".weight");
    const std::string suffix = ".weight";
    if (a != aliases.end() && a->second.size() > suffix.size() &&
        a->second.compare(a->second.size() - suffix.size(), suffix.size(), suffix) == 0)
      module_aliases[name] = a->second.substr(0, a->second.size() - suffix.size());
  }
  std::set<std::string> chosen;
  for (const std::string& target : options.targets()) {
    const std::vector<std::string> hit = select_names(names, target, module_aliases, who);
    if (hit.empty()) fail(who, ": LoRA target '", target, "' matches no module");
    chosen.insert(hit.begin(), hit.end());
  }
  std::vector<std::pair<std::string, Linear*>> layers;
  for (const auto& [name, m] : modules) {
    if (!chosen.count(name)) continue;
    auto* l = dynamic_cast<Linear*>(m);
    if (!l) fail(who, ": LoRA target module '", name, "' is not a Linear");
    if (l->lora) fail(who, ": '", name, "' has a LoRA adapter already");
    for (const auto& [other, m2] : modules) {
      bool shares = false;  // a parameter of m2's own (not a child's) is this weight
      if (m2 != m) {
        for (const auto& [pn, p] : m2->named_parameters())
          shares = shares || (pn.find('.') == std::string::npos && p.is_same(l->weight));
      }
      if (shares)
        fail(who, ": '", name, "''s weight is also '", other,
             "''s (tied embeddings): merging an adapter would change both; LoRA on a shared weight is not implemented");
    }
    if (options.rank() > std::min(l->in_features(), l->out_features()))
      fail(who, ": LoRA rank ", options.rank(), " is larger than '", name, "' (in ", l->in_features(), ", out ",
           l->out_features(), ")");
    layers.emplace_back(name, l);
  }
  for (const auto& [n, p] : model.named_parameters()) {
    Tensor t = p;
    t.zero_grad();
    t.set_requires_grad(false);
  }
  std::vector<std::string> out;
  for (auto& [name, l] : layers) {
    l->add_lora(options, gen);
    out.push_back(name);
  }
  return out;
}

std::vector<std::string> merge_lora(Module& model) {
  std::vector<std::string> out;
  for (auto& [name, l] : lora_layers(model)) {
    if (!l->lora->merged()) l->merge_lora();
    l->remove_lora();
    out.push_back(name);
  }
  return out;
}

}  // namespace xgrad::nn
