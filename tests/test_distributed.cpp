// The process group and the data-parallel wrapper, run by ctest under `mpirun -np 2` (every rank
// runs every test case; the collectives inside pair up). Without mpirun it runs as a group of
// one, where the same assertions hold trivially for the sums and exactly for the gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/distributed/data_parallel.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/clip.hpp"
#include "xgrad/weights/checkpoint.hpp"

using namespace xgrad;
using distributed::DataParallel;
using distributed::DataParallelOptions;
using distributed::ProcessGroup;

namespace {

ProcessGroup& group() { return ProcessGroup::world(); }

nn::LanguageModelOptions lm_options(std::size_t d_model = 16) {
  return nn::LanguageModelOptions(11, d_model, 2, 2).d_ff(32).max_len(8).dropout(0.f);
}

// A global batch of 4 sequences of 6 tokens; rank r of n takes rows [4r/n, 4(r+1)/n).
struct Data {
  IndexArray ids, targets;
};
Data global_batch(std::uint64_t seed) {
  Generator g(seed);
  Data d{IndexArray::from_shape({4, 6}), IndexArray::from_shape({4, 6})};
  for (std::size_t i = 0; i < d.ids.size(); ++i) {
    d.ids.data()[i] = static_cast<std::int64_t>(g.below(11));
    d.targets.data()[i] = static_cast<std::int64_t>(g.below(11));
  }
  return d;
}
Data my_rows(const Data& d) {
  const std::size_t rows = 4 / static_cast<std::size_t>(group().size()),
                    from = rows * static_cast<std::size_t>(group().rank());
  Data out{IndexArray::from_shape({rows, 6}), IndexArray::from_shape({rows, 6})};
  std::copy_n(d.ids.data() + from * 6, rows * 6, out.ids.data());
  std::copy_n(d.targets.data() + from * 6, rows * 6, out.targets.data());
  return out;
}

// True on every rank when `a` holds the same bits on every rank as on rank 0.
bool same_bits_everywhere(const Array& a) {
  Array reference = a;
  group().broadcast(reference, 0);
  const bool same = std::memcmp(reference.data(), a.data(), a.size() * sizeof(float)) == 0;
  return group().allreduce_min(same ? 1 : 0) == 1;
}

// Two layers, x (1, 3) -> a -> (1, 4) -> b -> (1, 2).
struct Chain : nn::Module {
  explicit Chain(Generator& g)
      : a(std::make_shared<nn::Linear>(3, 4, true, g)), b(std::make_shared<nn::Linear>(4, 2, true, g)) {
    register_module("a", a);
    register_module("b", b);
  }
  std::shared_ptr<nn::Linear> a, b;
};

// Every parameter of `got` has a gradient, equal to `want`'s.
void require_same_gradients(const nn::Module& got_module, const nn::Module& want_module) {
  const auto got = got_module.named_parameters(), want = want_module.named_parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    REQUIRE(got[i].second.has_grad());
    const Array& a = got[i].second.grad();
    const Array& b = want[i].second.grad();
    for (std::size_t k = 0; k < a.size(); ++k) REQUIRE(a.data()[k] == Approx(b.data()[k]).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("allreduce sums and averages, broadcast copies rank 0's values", "[distributed]") {
  const int n = group().size(), r = group().rank();
  Array a = {static_cast<float>(r + 1), 10.f * static_cast<float>(r + 1), 0.5f};
  group().allreduce_sum(a);
  const float total = static_cast<float>(n * (n + 1) / 2);
  REQUIRE(a(0) == total);
  REQUIRE(a(1) == 10.f * total);
  REQUIRE(a(2) == 0.5f * static_cast<float>(n));
  Array m = {static_cast<float>(2 * r)};
  group().allreduce_mean(m);
  REQUIRE(m(0) == Approx(static_cast<float>(n - 1)));
  REQUIRE(group().allreduce_sum(1.5) == 1.5 * n);
  REQUIRE(group().allreduce_max(static_cast<std::uint64_t>(r)) == static_cast<std::uint64_t>(n - 1));
  REQUIRE(group().allreduce_min(static_cast<std::uint64_t>(r + 5)) == 5u);

  Array b = {static_cast<float>(r), 7.f};
  group().broadcast(b, 0);
  REQUIRE(b(0) == 0.f);
  std::string s = r == 0 ? std::string(100000, 'x') + "end" : "short";
  group().broadcast(s, 0);
  REQUIRE(s.size() == 100003);
  REQUIRE(s.substr(100000) == "end");
  group().barrier();
}

TEST_CASE("collectives refuse lengths that differ between ranks, on every rank", "[distributed][bad_input]") {
  if (group().size() < 2) return;
  Array a = xt::ones<float>({static_cast<std::size_t>(3 + group().rank())});
  REQUIRE_THROWS_WITH(
      group().allreduce_sum(a),
      Catch::Contains("allreduce_sum: rank " + std::to_string(group().rank())) && Catch::Contains("from 3 to"));
  REQUIRE_THROWS_WITH(group().broadcast(a, 0),
                      Catch::Contains("broadcast: rank") && Catch::Contains("lengths range from 3"));
  REQUIRE_THROWS_WITH(group().broadcast(a, 7), Catch::Contains("root 7 is not a rank"));
  // The group still works afterwards.
  Array ok = {1.f};
  group().allreduce_sum(ok);
  REQUIRE(ok(0) == static_cast<float>(group().size()));
}

TEST_CASE("ranks in different collectives fail on every rank naming both calls, and the group still works",
          "[distributed][bad_input]") {
  if (group().size() < 2) return;
  const int r = group().rank();
  if (r == 0) {
    REQUIRE_THROWS_WITH(group().barrier(),
                        Catch::Contains("barrier: rank 0 is in barrier while rank 1 is in allreduce_sum (double)"));
  } else {
    REQUIRE_THROWS_WITH(group().allreduce_sum(1.0),
                        Catch::Contains("allreduce_sum: rank " + std::to_string(r) +
                                        " is in allreduce_sum (double) while rank 0 is in barrier") &&
                            Catch::Contains("every rank must make the same collective calls, in the same order"));
  }
  // agree() alone: the same call with different lengths names the lengths.
  REQUIRE_THROWS_WITH(group().agree(distributed::Call::broadcast, 10 + static_cast<std::uint64_t>(r)),
                      Catch::Contains("broadcast: rank " + std::to_string(r) + " passed " + std::to_string(10 + r) +
                                      " elements, but the ranks' lengths range from 10 to"));
  group().agree(distributed::Call::broadcast, 10);
  Array ok = {1.f};
  group().allreduce_sum(ok);
  REQUIRE(ok(0) == static_cast<float>(group().size()));
}

TEST_CASE("the timeout is seconds > 0, from XGRAD_DIST_TIMEOUT or set_timeout", "[distributed][bad_input]") {
  const double before = group().timeout();
  if (!std::getenv("XGRAD_DIST_TIMEOUT")) REQUIRE(before == 300.0);
  REQUIRE_THROWS_WITH(group().set_timeout(0),
                      Catch::Contains("ProcessGroup::set_timeout: 0 is not a number of seconds > 0"));
  REQUIRE_THROWS_WITH(group().set_timeout(-2), Catch::Contains("-2 is not a number of seconds > 0"));
  REQUIRE_THROWS_WITH(group().set_timeout(std::nan("")), Catch::Contains("nan is not a number of seconds > 0"));
  REQUIRE(group().timeout() == before);
  group().set_timeout(2.5);
  REQUIRE(group().timeout() == 2.5);
  group().set_timeout(before);
  Generator g(1);
  nn::Linear layer(3, 2, true, g);
  REQUIRE_THROWS_WITH(DataParallel(layer, group(), DataParallelOptions().timeout(-1)),
                      Catch::Contains("DataParallel: timeout -1 is not a number of seconds >= 0"));
  // A request's own timeout, on every rank and on one process too (NaN was taken as 0, the group's).
  float x = 1.f;
  for (const double bad : {-1.0, std::nan("")}) {
    REQUIRE_THROWS_WITH(group().iallreduce_sum(&x, 1, "x", bad),
                        Catch::Contains("iallreduce_sum: timeout ") &&
                            Catch::Contains(" is not a number of seconds >= 0 (0: the group's)"));
  }
  REQUIRE(x == 1.f);
}

TEST_CASE("iallreduce_sum's request finishes by wait, by test, or when it is destroyed", "[distributed]") {
  const float n = static_cast<float>(group().size());
  std::vector<float> a(5, 1.f), b(3, 2.f), c(2, 3.f);
  distributed::Request ra = group().iallreduce_sum(a.data(), a.size(), "first");
  distributed::Request rb = group().iallreduce_sum(b.data(), b.size(), "second", 30);
  distributed::Request moved = std::move(ra);
  REQUIRE_FALSE(ra.pending());
  moved.wait();
  REQUIRE_FALSE(moved.pending());
  while (!rb.test()) {
  }
  REQUIRE_FALSE(rb.pending());
  { distributed::Request rc = group().iallreduce_sum(c.data(), c.size()); }  // waits as it goes
  REQUIRE(a[4] == n);
  REQUIRE(b[0] == 2.f * n);
  REQUIRE(c[1] == 3.f * n);
}

TEST_CASE("DataParallel starts every rank from rank 0's weights", "[distributed]") {
  Generator g(100 + static_cast<std::uint64_t>(group().rank()));  // different weights on each rank
  nn::LanguageModel model(lm_options(), g);
  DataParallel ddp(model, group());
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(same_bits_everywhere(p.value()));
  }
}

TEST_CASE("after backward every gradient is the mean over ranks: the full batch's gradient", "[distributed][gemm]") {
  Generator g(7);
  nn::LanguageModel model(lm_options(), g);
  Generator g_ref(7);
  nn::LanguageModel reference(lm_options(), g_ref);  // same weights, no communication
  DataParallel ddp(model, group(), DataParallelOptions().bucket_bytes(2048));
  REQUIRE(ddp.num_buckets() > 2);

  const Data all = global_batch(3), mine = my_rows(all);
  model.loss(mine.ids, mine.targets).backward();
  reference.loss(all.ids, all.targets).backward();
  const auto got = model.named_parameters(), want = reference.named_parameters();
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    REQUIRE(got[i].second.has_grad());
    const Array& a = got[i].second.grad();
    const Array& b = want[i].second.grad();
    for (std::size_t k = 0; k < a.size(); ++k) REQUIRE(a.data()[k] == Approx(b.data()[k]).margin(2e-6).epsilon(1e-4));
    REQUIRE(same_bits_everywhere(a));
  }
  const distributed::ReductionStats& st = ddp.last_stats();
  REQUIRE(st.buckets == ddp.num_buckets());
  REQUIRE(st.bytes == (model.num_parameters() + model.named_parameters().size()) * sizeof(float));
  REQUIRE(st.overlap() >= 0.0);
  REQUIRE(st.overlap() <= 1.0);

  // A second backward accumulates, as without DataParallel.
  model.loss(mine.ids, mine.targets).backward();
  reference.loss(all.ids, all.targets).backward();
  const Array& a = model.named_parameters()[0].second.grad();
  const Array& b = reference.named_parameters()[0].second.grad();
  for (std::size_t k = 0; k < a.size(); ++k) REQUIRE(a.data()[k] == Approx(b.data()[k]).margin(4e-6).epsilon(1e-4));
}

TEST_CASE("parameters stay bit-identical on every rank through clipped AdamW steps", "[distributed][gemm]") {
  Generator g(11);
  nn::LanguageModel model(lm_options().dropout(0.1f), g);  // dropout differs per rank
  DataParallel ddp(model, group());
  optim::AdamW opt(model.named_parameters(), optim::AdamOptions(1e-2f).weight_decay(0.1f));
  manual_seed(1000 + static_cast<std::uint64_t>(group().rank()));
  for (std::uint64_t step = 0; step < 5; ++step) {
    const Data mine = my_rows(global_batch(step));
    opt.zero_grad();
    model.loss(mine.ids, mine.targets).backward();
    optim::clip_grad_norm(opt.params(), 0.5f);
    opt.step();
  }
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(same_bits_everywhere(p.value()));
  }
}

TEST_CASE("a parameter used on some ranks only gets the mean, and one used nowhere gets no gradient",
          "[distributed][gemm]") {
  struct Two : nn::Module {
    explicit Two(Generator& g)
        : a(std::make_shared<nn::Linear>(3, 2, true, g)),
          b(std::make_shared<nn::Linear>(3, 2, true, g)),
          c(std::make_shared<nn::Linear>(3, 2, true, g)) {
      register_module("a", a);
      register_module("b", b);
      register_module("c", c);
    }
    std::shared_ptr<nn::Linear> a, b, c;
  };
  Generator g(5);
  Two m(g);
  DataParallel ddp(m, group());
  const Tensor x(Array{{1.f, 2.f, 3.f}});
  Tensor loss = sum(m.a->forward(x));
  if (group().rank() == 0) loss = loss + sum(m.b->forward(x));  // b is used on rank 0 only
  loss.backward();
  REQUIRE(m.a->named_parameters()[0].second.has_grad());
  REQUIRE(m.b->named_parameters()[0].second.has_grad());  // on every rank
  const float n = static_cast<float>(group().size());
  REQUIRE(m.b->named_parameters()[0].second.grad()(0, 0) == Approx(1.f / n));  // d sum(W x)/dW00 = x0 = 1, on one rank
  REQUIRE(m.a->named_parameters()[0].second.grad()(1, 2) == Approx(3.f));
  REQUIRE_FALSE(m.c->named_parameters()[0].second.has_grad());
}

TEST_CASE("ranks whose models differ fail on every rank, naming the first differing parameter",
          "[distributed][bad_input]") {
  if (group().size() < 2) return;
  Generator g(1);
  nn::LanguageModel model(lm_options(group().rank() == 0 ? 16 : 32), g);
  REQUIRE_THROWS_WITH(DataParallel(model, group()),
                      Catch::Contains("DataParallel: rank " + std::to_string(group().rank())) &&
                          Catch::Contains("differ at parameter 0") && Catch::Contains("tok_emb.weight (11, 16)"));
  // The group still works afterwards.
  Array ok = {2.f};
  group().allreduce_sum(ok);
  REQUIRE(ok(0) == 2.f * static_cast<float>(group().size()));
}

TEST_CASE("DataParallel refuses a bucket smaller than one float", "[distributed][bad_input]") {
  Generator g(1);
  nn::LanguageModel model(lm_options(), g);
  REQUIRE_THROWS_WITH(DataParallel(model, group(), DataParallelOptions().bucket_bytes(2)),
                      Catch::Contains("bucket_bytes 2"));
}

TEST_CASE("a backward that fails midway leaves the next one correct", "[distributed][gemm]") {
  Generator g(3);
  Chain m(g);
  DataParallel ddp(m, group(), DataParallelOptions().bucket_bytes(16));  // a bucket per tensor
  const Tensor x(Array{{1.f, -2.f, 3.f}});
  {
    Tensor h = m.a->forward(x);
    // b's gradients are final (and their reductions started) before h's arrives and fails.
    h.register_hook([](Array&) { fail("a hook that fails"); });
    REQUIRE_THROWS_WITH(sum(m.b->forward(tanh(h))).backward(), Catch::Contains("a hook that fails"));
  }
  m.zero_grad();
  sum(m.b->forward(tanh(m.a->forward(x)))).backward();
  // The same input on every rank: the mean is this rank's own gradient.
  Generator g_ref(3);
  Chain ref(g_ref);
  sum(ref.b->forward(tanh(ref.a->forward(x)))).backward();
  require_same_gradients(m, ref);
}

TEST_CASE("a tensor registered under two names (tied weights) is averaged once, as the sum of both uses",
          "[distributed][gemm]") {
  struct Tied : nn::Module {
    explicit Tied(Generator& g) : shared(std::make_shared<nn::Linear>(3, 3, true, g)) {
      register_module("enc", shared);
      register_module("dec", shared);  // the same layer again: its weight appears under both names
    }
    std::shared_ptr<nn::Linear> shared;
  };
  Generator g(7);
  Tied m(g);
  REQUIRE(m.named_parameters().size() == 2);  // listed once, under "enc"
  DataParallel ddp(m, group(), DataParallelOptions().bucket_bytes(16));
  const Tensor x(Array{{1.f, -2.f, 3.f}});
  sum(m.shared->forward(tanh(m.shared->forward(x)))).backward();
  // The same input on every rank: the mean is this rank's own gradient, both uses summed once.
  Generator g_ref(7);
  Tied ref(g_ref);
  sum(ref.shared->forward(tanh(ref.shared->forward(x)))).backward();
  for (std::size_t i = 0; i < 2; ++i) {
    const Array& got = m.named_parameters()[i].second.grad();
    const Array& want = ref.named_parameters()[i].second.grad();
    for (std::size_t k = 0; k < got.size(); ++k) REQUIRE(got.data()[k] == Approx(want.data()[k]).margin(1e-6));
  }
}

TEST_CASE("a backward on a second thread while one is under way is refused, and the first is still right",
          "[distributed][bad_input][gemm]") {
  Generator g(3);
  Chain m(g);
  DataParallel ddp(m, group(), DataParallelOptions().bucket_bytes(16));
  const Tensor x(Array{{1.f, -2.f, 3.f}});
  std::string refused;
  // b's gradients have been handed over (the pass is under way) when a's weight's hook runs a
  // second backward through b on another thread.
  Tensor a_weight = m.a->named_parameters()[0].second;
  const auto id = a_weight.register_hook([&](Array&) {
    std::thread other([&] {
      try {
        sum(m.b->forward(Tensor(Array{{1.f, 1.f, 1.f, 1.f}}))).backward();
      } catch (const Error& e) {
        refused = e.what();
      }
    });
    other.join();
  });
  sum(m.b->forward(tanh(m.a->forward(x)))).backward();
  a_weight.remove_hook(id);
  REQUIRE_THAT(refused, Catch::Contains("DataParallel: a backward pass reached the parameters on a second thread") &&
                            Catch::Contains("one backward pass at a time per rank"));
  Generator g_ref(3);
  Chain ref(g_ref);
  sum(ref.b->forward(tanh(ref.a->forward(x)))).backward();
  require_same_gradients(m, ref);
  // And the next pass, on this thread, is a pass like any other.
  m.zero_grad();
  sum(m.b->forward(tanh(m.a->forward(x)))).backward();
  REQUIRE(m.a->named_parameters()[0].second.grad()(0, 0) == Approx(ref.a->named_parameters()[0].second.grad()(0, 0)));
}
