// Bad input to the layers, the optimizers and schedules, checkpoints and the engine, and empty
// tensors / zero-length sequences through the core ops: each either has a defined result (asserted
// here) or raises an xgrad::Error whose message names the function or module and the offending
// shape or value. Nothing may crash, hang or turn into NaN silently.
//
// tests/BAD_INPUT.md is the full table (this file's rows plus those of test_errors.cpp,
// test_tape.cpp, test_nn_modules.cpp, test_optim.cpp and test_checkpoint.cpp, which this file
// does not repeat). Test cases tagged [bug] pin inputs that once crashed, yielded NaN silently
// or got an unclear message.
//
// Shapes: B batch, T query length, S key length, C channels / d_model, H heads, V vocabulary.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/autograd/tensor.hpp"
#include "xgrad/core/error.hpp"
#include "xgrad/core/random.hpp"
#include "xgrad/inspect/head_importance.hpp"
#include "xgrad/nn/attention.hpp"
#include "xgrad/nn/layers.hpp"
#include "xgrad/nn/transformer.hpp"
#include "xgrad/optim/adam.hpp"
#include "xgrad/optim/clip.hpp"
#include "xgrad/optim/schedule.hpp"
#include "xgrad/optim/sgd.hpp"
#include "xgrad/weights/checkpoint.hpp"

#include "small_models.hpp"

using namespace xgrad;
using Catch::Contains;
using testing::tiny_lm;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

Tensor randn(const Shape& shape, std::uint64_t seed, bool requires_grad = true) {
  Generator g(seed);
  return Tensor(g.normal(shape, 0.f, 1.f), requires_grad);
}

Tensor empty(const Shape& shape, bool requires_grad = true) { return Tensor(Array::from_shape(shape), requires_grad); }

bool all_equal(const Array& a, float v) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a.data()[i] != v) return false;
  }
  return true;
}

bool all_finite(const Array& a) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a.data()[i])) return false;
  }
  return true;
}

// Runs f in a child process, so that a crash or a hang fails the calling test instead of killing
// the whole test program. Returns what f returned ("returned: ..."), "xgrad::Error: <message>",
// "other exception: ...", "killed by signal N (name)" or "timed out after N s".
std::string outcome_in_child(const std::function<std::string()>& f, unsigned seconds = 30) {
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    // Catch's fatal-signal handlers would report (and print a summary) from inside the child.
    for (int sig : {SIGSEGV, SIGABRT, SIGFPE, SIGILL, SIGBUS}) std::signal(sig, SIG_DFL);
    ::alarm(seconds);
    std::string out;
    try {
      out = "returned: " + f();
    } catch (const Error& e) {
      out = std::string("xgrad::Error: ") + e.what();
    } catch (const std::exception& e) {
      out = std::string("other exception: ") + e.what();
    }
    const ssize_t ignored = ::write(fds[1], out.data(), out.size());
    (void)ignored;
    ::close(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    if (sig == SIGALRM) return "timed out after " + std::to_string(seconds) + " s";
    return "killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return got;
}

Tensor param(const Array& values) { return Tensor(values, true); }

// Gives p the gradient k (the gradient of sum(p * k)).
void set_grad(const Tensor& p, const Array& k) { sum(p * Tensor(k)).backward(); }

}  // namespace

// =============================================================================================
// Core ops: empty tensors and zero-length axes

TEST_CASE("sum of an empty tensor is 0 and its gradient is an empty array", "[bad_input][ops][empty]") {
  Tensor x = empty({0, 3});
  Tensor s = sum(x);
  REQUIRE(s.shape() == Shape{});
  REQUIRE(s.item() == 0.f);
  s.backward();
  REQUIRE(x.grad().shape() == Shape{0, 3});

  // over the empty axis: zeros of the remaining shape; over the other axis: an empty result
  Tensor y = empty({0, 3});
  Tensor s0 = sum(y, {0});
  REQUIRE(s0.shape() == Shape{3});
  REQUIRE(all_equal(s0.value(), 0.f));
  REQUIRE(sum(y, {1}).shape() == Shape{0});
  Tensor k = sum(empty({2, 0}), {1}, /*keepdims=*/true);
  REQUIRE(k.shape() == Shape{2, 1});
  REQUIRE(all_equal(k.value(), 0.f));
}

TEST_CASE("mean over an empty axis is an error naming the shape, never NaN", "[bad_input][ops][empty]") {
  REQUIRE_THROWS_AS(mean(empty({0, 3})), Error);
  REQUIRE_THROWS_WITH(mean(empty({0, 3})), Contains("mean") && Contains("(0, 3)") && Contains("empty axis"));
  REQUIRE_THROWS_WITH(mean(empty({0, 3}), {0}), Contains("mean") && Contains("(0, 3)"));
  REQUIRE_THROWS_WITH(mean(empty({2, 0, 4}), {1, 2}), Contains("mean") && Contains("(2, 0, 4)"));
  // reducing a non-empty axis of an empty tensor is fine and empty
  REQUIRE(mean(empty({0, 3}), {1}).shape() == Shape{0});
  // a 0-d tensor has one element: its mean is itself
  REQUIRE(mean(Tensor::scalar(2.5f)).item() == 2.5f);
}

TEST_CASE("max over an empty axis is an error, over another axis of an empty tensor it is empty",
          "[bad_input][ops][empty]") {
  REQUIRE_THROWS_AS(max(empty({2, 0}), 1), Error);
  REQUIRE_THROWS_WITH(max(empty({2, 0}), 1),
                      Contains("max") && Contains("axis 1") && Contains("(2, 0)") && Contains("empty"));
  REQUIRE_THROWS_WITH(max(empty({2, 0}), -1), Contains("max") && Contains("axis -1") && Contains("(2, 0)"));
  Tensor x = empty({0, 3});
  Tensor m = max(x, 1);
  REQUIRE(m.shape() == Shape{0});
  sum(m).backward();
  REQUIRE(x.grad().shape() == Shape{0, 3});
}

TEST_CASE("matmul with K = 0 gives exact zeros and empty gradients", "[bad_input][ops][empty][matmul][gemm]") {
  SECTION("(2, 0) @ (0, 3)") {
    Tensor a = empty({2, 0}), b = empty({0, 3});
    Tensor c = matmul(a, b);
    REQUIRE(c.shape() == Shape{2, 3});
    REQUIRE(all_equal(c.value(), 0.f));
    sum(c).backward();
    REQUIRE(a.grad().shape() == Shape{2, 0});
    REQUIRE(b.grad().shape() == Shape{0, 3});
  }
  SECTION("transposed operands") {
    Tensor a = empty({0, 2}), b = empty({3, 0});
    Tensor c = matmul(a, b, /*transpose_a=*/true, /*transpose_b=*/true);  // (2, 0) @ (0, 3)
    REQUIRE(c.shape() == Shape{2, 3});
    REQUIRE(all_equal(c.value(), 0.f));
    sum(c).backward();
    REQUIRE(a.grad().shape() == Shape{0, 2});
  }
  SECTION("batched, with a shared 2-D right operand and with a batched one") {
    Tensor a = empty({4, 2, 0}), w = empty({0, 5}), b = empty({4, 0, 5});
    Tensor c1 = matmul(a, w);
    Tensor c2 = matmul(a, b);
    REQUIRE(c1.shape() == Shape{4, 2, 5});
    REQUIRE(c2.shape() == Shape{4, 2, 5});
    REQUIRE(all_equal(c1.value(), 0.f));
    REQUIRE(all_equal(c2.value(), 0.f));
    sum(c1 + c2).backward();
    REQUIRE(w.grad().shape() == Shape{0, 5});
  }
}

TEST_CASE("matmul with M = 0, N = 0 or an empty batch gives an empty result and zero gradients",
          "[bad_input][ops][empty][matmul][gemm]") {
  SECTION("M = 0: the right operand's gradient is zero") {
    Tensor a = empty({0, 2}), b = Tensor::ones({2, 3}, true);
    Tensor c = matmul(a, b);
    REQUIRE(c.shape() == Shape{0, 3});
    sum(c).backward();
    REQUIRE(b.grad().shape() == Shape{2, 3});
    REQUIRE(all_equal(b.grad(), 0.f));
  }
  SECTION("N = 0: the left operand's gradient is zero") {
    Tensor a = Tensor::ones({2, 2}, true), b = empty({2, 0});
    Tensor c = matmul(a, b);
    REQUIRE(c.shape() == Shape{2, 0});
    sum(c).backward();
    REQUIRE(all_equal(a.grad(), 0.f));
  }
  SECTION("an empty batch") {
    Tensor a = empty({0, 2, 2}), b = empty({0, 2, 3});
    Tensor c = matmul(a, b);
    REQUIRE(c.shape() == Shape{0, 2, 3});
    sum(c).backward();
    REQUIRE(b.grad().shape() == Shape{0, 2, 3});
  }
}

TEST_CASE("linear names the function and the shapes it cannot combine", "[bad_input][ops][linear]") {
  const Tensor x = Tensor::ones({2, 3}), w = Tensor::ones({4, 3}), b = Tensor::ones({4});
  CHECK_THROWS_WITH(linear(x, Tensor::ones({4, 3, 1})),
                    Catch::Contains("linear: weight must be (out, in), got (4, 3, 1)"));
  CHECK_THROWS_WITH(linear(Tensor::ones({2, 5}), w),
                    Catch::Contains("linear: input of shape (2, 5) does not end in the weight's in_features 3"));
  CHECK_THROWS_WITH(linear(Tensor::ones(Shape{}), w), Catch::Contains("linear: input of shape () does not end"));
  CHECK_THROWS_WITH(linear(x, w, Tensor::ones({3})), Catch::Contains("linear: bias of shape (3) is not (out,) = (4,)"));
  CHECK_THROWS_WITH(linear(Tensor(), w, b), Catch::Contains("linear: input is an undefined tensor"));
}

TEST_CASE("linear with in_features 0 gives the bias, and with no rows an empty result",
          "[bad_input][ops][empty][linear][gemm]") {
  SECTION("in = 0: y is the bias on every row, the weight's gradient is empty") {
    Tensor x = empty({2, 0}), w = empty({3, 0});
    Tensor b = Tensor(Array{1.f, 2.f, 3.f}, true);
    Tensor y = linear(x, w, b);
    REQUIRE(y.shape() == Shape{2, 3});
    REQUIRE(y.value() == Array{{1.f, 2.f, 3.f}, {1.f, 2.f, 3.f}});
    sum(y).backward();
    REQUIRE(w.grad().shape() == Shape{3, 0});
    REQUIRE(b.grad() == Array{2.f, 2.f, 2.f});
  }
  SECTION("no rows: an empty result, zero weight and bias gradients") {
    Tensor x = empty({0, 2}), w = Tensor::ones({3, 2}, true), b = Tensor::ones({3}, true);
    Tensor y = linear(x, w, b);
    REQUIRE(y.shape() == Shape{0, 3});
    sum(y).backward();
    REQUIRE(all_equal(w.grad(), 0.f));
    REQUIRE(all_equal(b.grad(), 0.f));
  }
}

TEST_CASE("attention_weights and attend name the function and the shapes that do not fit",
          "[bad_input][ops][attention]") {
  const Tensor q = Tensor::ones({2, 3, 4}), k = Tensor::ones({2, 5, 4});
  CHECK_THROWS_WITH(
      attention_weights(Tensor::ones({3, 4}), k, 2, 1.f),
      Catch::Contains("attention_weights: q and k must be (B, T, C) and (B, S, C), got (3, 4) and (2, 5, 4)"));
  CHECK_THROWS_WITH(attention_weights(q, k, 3, 1.f),
                    Catch::Contains("attention_weights: 4 channels do not split into 3 heads"));
  CHECK_THROWS_WITH(attention_weights(q, k, 0, 1.f), Catch::Contains("do not split into 0 heads"));
  CHECK_THROWS_WITH(attention_weights(q, Tensor::ones({1, 5, 4}), 2, 1.f),
                    Catch::Contains("attention_weights: k of shape (1, 5, 4) does not match q of shape (2, 3, 4)"));
  CHECK_THROWS_WITH(attention_scores(q, Tensor::ones({2, 5, 6}), 2, 1.f),
                    Catch::Contains("attention_scores: k of shape (2, 5, 6) does not match q of shape (2, 3, 4)"));
  CHECK_THROWS_WITH(attention_scores(q, k, 3, 1.f),
                    Catch::Contains("attention_scores: 4 channels do not split into 3 heads"));
  const Mask wrong = xt::zeros<bool>(Shape{2, 1, 3, 4});
  CHECK_THROWS_WITH(
      attention_weights(q, k, 2, 1.f, false, &wrong),
      Catch::Contains(
          "attention_weights: mask of shape (2, 1, 3, 4) does not broadcast to the input's shape (2, 2, 3, 5)"));
  const Tensor w = Tensor::ones({2, 2, 3, 5}), v = Tensor::ones({2, 5, 4});
  CHECK_THROWS_WITH(attend(Tensor::ones({2, 3, 5}), v, 2),
                    Catch::Contains("attend: weights and v must be (B, H, T, S) and (B, S, C)"));
  CHECK_THROWS_WITH(
      attend(w, Tensor::ones({2, 4, 4}), 2),
      Catch::Contains("attend: weights of shape (2, 2, 3, 5) do not match v of shape (2, 4, 4) and 2 heads"));
  CHECK_THROWS_WITH(attend(w, v, 3), Catch::Contains("attend: 4 channels of v do not split into 3 heads"));
  CHECK_THROWS_WITH(attend(w, Tensor(), 2), Catch::Contains("attend: input is an undefined tensor"));
}

TEST_CASE("attention over empty sizes gives empty or zero results", "[bad_input][ops][empty][attention][gemm]") {
  SECTION("no keys: every weight row is empty and attend gives zeros") {
    Tensor q = Tensor::ones({2, 3, 4}, true), k = empty({2, 0, 4}), v = empty({2, 0, 4});
    const Tensor w = attention_weights(q, k, 2, 1.f);
    REQUIRE(w.shape() == Shape{2, 2, 3, 0});
    const Tensor out = attend(w, v, 2);
    REQUIRE(out.shape() == Shape{2, 3, 4});
    REQUIRE(all_equal(out.value(), 0.f));
    sum(out).backward();
    REQUIRE(all_equal(q.grad(), 0.f));
  }
  SECTION("zero-width heads: uniform weights over the keys") {
    Tensor q = empty({1, 2, 0}), k = empty({1, 3, 0});
    const Tensor w = attention_weights(q, k, 2, 1.f);
    REQUIRE(w.shape() == Shape{1, 2, 2, 3});
    for (float x : w.value()) REQUIRE(x == Approx(1.f / 3.f));
  }
}

TEST_CASE("softmax, log_softmax and masked_softmax over an empty axis give an empty result",
          "[bad_input][ops][empty]") {
  for (const Shape& s : std::vector<Shape>{{2, 0}, {0, 3}, {0}}) {
    INFO("shape " << shape_str(s));
    Tensor x = empty(s);
    Tensor y1 = softmax(x), y2 = log_softmax(x), y3 = masked_softmax(x, Mask(xt::zeros<bool>(s)));
    REQUIRE(y1.shape() == s);
    REQUIRE(y2.shape() == s);
    REQUIRE(y3.shape() == s);
    sum(y1 + y2 + y3).backward();
    REQUIRE(x.grad().shape() == s);
  }
}

TEST_CASE("layer_norm of an empty batch is empty with zero gamma and beta gradients", "[bad_input][ops][empty]") {
  for (const Shape& s : std::vector<Shape>{{0, 4}, {2, 0, 4}}) {
    INFO("shape " << shape_str(s));
    Tensor x = empty(s);
    Tensor gamma = Tensor::ones({4}, true), beta = Tensor::zeros({4}, true);
    Tensor y = layer_norm(x, gamma, beta);
    REQUIRE(y.shape() == s);
    sum(y).backward();
    REQUIRE(all_equal(gamma.grad(), 0.f));
    REQUIRE(all_equal(beta.grad(), 0.f));
  }
  // C = 0 (nothing to normalize): empty, no division by zero
  REQUIRE(layer_norm(empty({2, 0}), Tensor(), Tensor()).shape() == Shape{2, 0});
  // a 0-d input has no axis to normalize
  REQUIRE_THROWS_WITH(layer_norm(Tensor::scalar(1.f), Tensor(), Tensor()), Contains("layer_norm") && Contains("axis"));
}

TEST_CASE("cross_entropy of an empty batch is 0, with C = 0 every target is out of range", "[bad_input][ops][empty]") {
  Tensor logits = empty({0, 3});
  Tensor loss = cross_entropy(logits, IndexArray::from_shape({0}));
  REQUIRE(loss.item() == 0.f);
  REQUIRE_NOTHROW(loss.backward());

  REQUIRE_THROWS_AS(cross_entropy(empty({2, 0}), IndexArray{0, 0}), Error);
  REQUIRE_THROWS_WITH(cross_entropy(empty({2, 0}), IndexArray{0, 0}),
                      Contains("cross_entropy") && Contains("target 0") && Contains("[0, 0)"));
  REQUIRE_THROWS_WITH(cross_entropy(Tensor::scalar(1.f), IndexArray(0)),
                      Contains("cross_entropy") && Contains("scalar"));
}

TEST_CASE("embedding, dropout, concat, split and reshape accept empty tensors", "[bad_input][ops][empty]") {
  Tensor w = randn({4, 3}, 1);
  REQUIRE(embedding(w, IndexArray::from_shape({0})).shape() == Shape{0, 3});
  REQUIRE(embedding(w, IndexArray::from_shape({2, 0})).shape() == Shape{2, 0, 3});
  REQUIRE(dropout(empty({0, 3}), 0.5f).shape() == Shape{0, 3});

  Tensor e = empty({0, 3}), f = Tensor::ones({2, 3}, true);
  Tensor c = concat({e, f}, 0);
  REQUIRE(c.shape() == Shape{2, 3});
  sum(c).backward();
  REQUIRE(e.grad().shape() == Shape{0, 3});
  REQUIRE(all_equal(f.grad(), 1.f));

  const std::vector<Tensor> parts = split(Tensor::ones({3, 2}), {0, 3, 0}, 0);
  REQUIRE(parts.size() == 3);
  REQUIRE(parts[0].shape() == Shape{0, 2});
  REQUIRE(parts[1].shape() == Shape{3, 2});

  REQUIRE(reshape(empty({0, 3}), {-1, 3}).shape() == Shape{0, 3});
  REQUIRE(reshape(empty({0, 3}), {3, 0, 5}).shape() == Shape{3, 0, 5});
  // -1 next to a 0 is ambiguous: an error, not a division by zero
  REQUIRE_THROWS_AS(reshape(empty({0, 3}), {-1, 0}), Error);
  REQUIRE_THROWS_WITH(reshape(empty({0, 3}), {-1, 0}),
                      Contains("reshape") && Contains("(0, 3)") && Contains("(-1, 0)"));
}

TEST_CASE("broadcasting with an empty axis follows numpy", "[bad_input][ops][empty]") {
  Tensor x = empty({0, 3}), b = Tensor::ones({1, 3}, true);
  Tensor y = x + b;
  REQUIRE(y.shape() == Shape{0, 3});
  sum(y).backward();
  REQUIRE(b.grad().shape() == Shape{1, 3});
  REQUIRE(all_equal(b.grad(), 0.f));
  // 0 and 2 do not broadcast
  REQUIRE_THROWS_WITH(empty({0, 3}) * Tensor::ones({2, 3}),
                      Contains("mul") && Contains("(0, 3)") && Contains("(2, 3)"));
}

TEST_CASE("0-d tensors: reductions and elementwise ops work, axis ops name rank 0", "[bad_input][ops]") {
  Tensor x = Tensor::scalar(2.f, true);
  Tensor y = sum(x) + mean(x) + sum(reshape(x, {1, 1})) + sum(x * Tensor::ones({2, 3}));
  REQUIRE(y.item() == Approx(2.f + 2.f + 2.f + 12.f));
  y.backward();
  REQUIRE(x.grad()() == Approx(9.f));
  REQUIRE(reshape(x, {-1}).shape() == Shape{1});
  REQUIRE(shape_str(sum(Tensor::ones({2, 3}), {}).shape()) == "(2, 3)");  // no axes: nothing reduced
  REQUIRE_THROWS_WITH(softmax(x), Contains("softmax") && Contains("axis -1") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(log_softmax(x), Contains("log_softmax") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(masked_softmax(x, Mask(false)), Contains("masked_softmax") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(max(x, 0), Contains("max") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(slice(x, 0, 0, 1), Contains("slice") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(concat({x, x}, 0), Contains("concat") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(split(x, {1}, 0), Contains("split") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(transpose(x, 0, 0), Contains("transpose") && Contains("rank 0"));
  REQUIRE_THROWS_WITH(matmul(x, x), Contains("matmul") && Contains("() @ ()"));
}

// permute_array walks its index with `for (k = n - 1; k-- > 0;)`, which wraps around for n = 0.
TEST_CASE("permute of a 0-d tensor with no axes is the identity, not a crash", "[bad_input][ops][bug][gemm]") {
  const std::string got = outcome_in_child([] {
    Tensor x = Tensor::scalar(2.5f, true);
    Tensor y = permute(x, {});
    y.backward();
    return "value " + std::to_string(y.item()) + ", grad " + std::to_string(x.grad()());
  });
  REQUIRE(got == "returned: value 2.500000, grad 1.000000");
}

// =============================================================================================
// Engine edge cases not covered by test_errors.cpp / test_tape.cpp

TEST_CASE("backward of an empty tensor needs a seed of its shape and gives an empty gradient",
          "[bad_input][engine][empty]") {
  Tensor x = empty({0, 3});
  Tensor y = x * 2.f;
  REQUIRE_THROWS_AS(y.backward(), Error);
  REQUIRE_THROWS_WITH(y.backward(), Contains("backward") && Contains("seed") && Contains("(0, 3)"));
  y.backward(Array::from_shape({0, 3}));
  REQUIRE(x.grad().shape() == Shape{0, 3});
}

TEST_CASE("backward called from a hook is an error and the engine keeps working", "[bad_input][engine]") {
  Tensor x(Array{1.f, 2.f}, true);
  Tensor other = sum(x * 3.f);
  Tensor h = x * 2.f;
  h.register_hook([&](Array&) { other.backward(); });
  Tensor loss = sum(h);
  REQUIRE_THROWS_AS(loss.backward(), Error);
  REQUIRE_NOTHROW(sum(x * 2.f).backward());  // no stale pass left behind
  x.zero_grad();
  Tensor h2 = x * 2.f;
  h2.register_hook([&](Array&) { sum(x * x).backward(); });
  REQUIRE_THROWS_WITH(sum(h2).backward(), Contains("backward") && Contains("inside another backward"));
  x.zero_grad();
  sum(x * x).backward();
  REQUIRE(x.grad()(1) == 4.f);
}

TEST_CASE("Tensor accessors reject bad axes, sizes and hooks on tensors without grad", "[bad_input][engine]") {
  Tensor a = randn({2, 3}, 2);
  REQUIRE_THROWS_WITH(a.dim(2), Contains("Tensor::dim") && Contains("axis 2") && Contains("rank 2"));
  REQUIRE_THROWS_WITH(a.dim(-3), Contains("Tensor::dim") && Contains("axis -3"));
  REQUIRE(a.dim(-1) == 3);
  REQUIRE_THROWS_WITH(Tensor::zeros({0}).item(), Contains("Tensor::item") && Contains("(0)") && Contains("0 elements"));
  Tensor c = Tensor::ones({2});
  REQUIRE_THROWS_WITH(c.register_hook([](Array&) {}), Contains("register_hook") && Contains("does not require grad"));
  REQUIRE_THROWS_WITH(c.retain_grad(), Contains("retain_grad") && Contains("does not require grad"));
  REQUIRE_THROWS_WITH(a.register_hook(GradHook()), Contains("register_hook") && Contains("empty hook"));
  REQUIRE_THROWS_WITH(a.remove_hook(12345), Contains("remove_hook") && Contains("12345"));
}

// =============================================================================================
// Layers

TEST_CASE("Linear rejects a wrong last dimension, a 0-d input and zero features", "[bad_input][nn][linear][gemm]") {
  Generator gen(1);
  nn::Linear lin(4, 3, true, gen);
  for (const Shape& s : std::vector<Shape>{{2, 5}, {2, 3, 5}, {5}, {4, 1}}) {
    INFO("input " << shape_str(s));
    REQUIRE_THROWS_AS(lin.forward(randn(s, 3)), Error);
    REQUIRE_THROWS_WITH(lin.forward(randn(s, 3)),
                        Contains("Linear") && Contains(shape_str(s)) && Contains("in_features 4"));
  }
  REQUIRE_THROWS_WITH(lin.forward(Tensor::scalar(1.f)),
                      Contains("Linear") && Contains("()") && Contains("in_features 4"));
  REQUIRE_THROWS_WITH(lin.forward(Tensor()), Contains("Linear") && Contains("undefined"));
  REQUIRE_THROWS_AS(nn::Linear(0, 3), Error);
  REQUIRE_THROWS_WITH(nn::Linear(0, 3), Contains("Linear") && Contains("in_features 0"));
  REQUIRE_THROWS_WITH(nn::Linear(4, 0), Contains("Linear") && Contains("out_features 0"));
  // a single vector is fine: (in,) -> (out,)
  REQUIRE(lin.forward(randn({4}, 4)).shape() == Shape{3});
}

TEST_CASE("Linear maps an empty batch to an empty batch with zero weight gradients",
          "[bad_input][nn][linear][empty][gemm]") {
  Generator gen(2);
  nn::Linear lin(4, 3, true, gen);
  for (const Shape& s : std::vector<Shape>{{0, 4}, {2, 0, 4}}) {
    INFO("input " << shape_str(s));
    lin.zero_grad();
    Tensor y = lin.forward(empty(s));
    Shape want = s;
    want.back() = 3;
    REQUIRE(y.shape() == want);
    sum(y).backward();
    REQUIRE(all_equal(lin.weight.grad(), 0.f));
    REQUIRE(all_equal(lin.bias.grad(), 0.f));
  }
}

TEST_CASE("LayerNorm rejects a wrong width, eps <= 0, NaN or infinite and zero features",
          "[bad_input][nn][layer_norm]") {
  nn::LayerNorm ln(4);
  REQUIRE_THROWS_AS(ln.forward(randn({2, 5}, 1)), Error);
  REQUIRE_THROWS_WITH(ln.forward(randn({2, 5}, 1)), Contains("LayerNorm") && Contains("(2, 5)") && Contains("4"));
  REQUIRE_THROWS_WITH(ln.forward(randn({4, 2}, 1)), Contains("LayerNorm") && Contains("(4, 2)"));
  REQUIRE_THROWS_WITH(ln.forward(Tensor::scalar(1.f)), Contains("LayerNorm") && Contains("()"));
  REQUIRE_THROWS_WITH(nn::LayerNorm(4, 0.f), Contains("LayerNorm") && Contains("eps") && Contains("got 0"));
  REQUIRE_THROWS_WITH(nn::LayerNorm(4, -1e-5f), Contains("LayerNorm") && Contains("eps") && Contains("-1e-05"));
  REQUIRE_THROWS_WITH(nn::LayerNorm(4, kNaN), Contains("LayerNorm") && Contains("eps") && Contains("nan"));
  REQUIRE_THROWS_WITH(nn::LayerNorm(4, kInf), Contains("LayerNorm") && Contains("eps") && Contains("inf"));
  REQUIRE_THROWS_WITH(nn::LayerNorm(0), Contains("LayerNorm") && Contains("features"));
  // an empty batch is fine
  REQUIRE(ln.forward(empty({0, 4})).shape() == Shape{0, 4});
}

TEST_CASE("Dropout rejects p below 0, p of 1 or more, and NaN", "[bad_input][nn][dropout]") {
  REQUIRE_THROWS_WITH(nn::Dropout(-0.1f), Contains("Dropout") && Contains("-0.1") && Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(nn::Dropout(1.f), Contains("Dropout") && Contains("probability 1 ") && Contains("[0, 1)"));
  REQUIRE_THROWS_WITH(nn::Dropout(1.5f), Contains("Dropout") && Contains("1.5"));
  REQUIRE_THROWS_WITH(nn::Dropout(kNaN), Contains("Dropout") && Contains("nan"));
  REQUIRE_THROWS_WITH(nn::Dropout(-kInf), Contains("Dropout") && Contains("-inf"));
  REQUIRE_NOTHROW(nn::Dropout(0.f));
}

TEST_CASE("Embedding rejects ids out of range, negative ids and zero sizes", "[bad_input][nn][embedding]") {
  Generator gen(3);
  nn::Embedding emb(5, 3, gen);
  const auto ci = Catch::CaseSensitive::No;
  REQUIRE_THROWS_AS(emb.forward(IndexArray{0, -1}), Error);
  REQUIRE_THROWS_WITH(emb.forward(IndexArray{0, -1}),
                      Contains("embedding", ci) && Contains("index -1") && Contains("5 rows"));
  REQUIRE_THROWS_WITH(emb.forward(IndexArray{{0, 5}}),
                      Contains("embedding", ci) && Contains("index 5") && Contains("5 rows"));
  REQUIRE_THROWS_WITH(emb.forward(IndexArray{std::numeric_limits<std::int64_t>::max()}),
                      Contains("embedding", ci) && Contains("9223372036854775807"));
  REQUIRE_THROWS_WITH(nn::Embedding(0, 3), Contains("Embedding") && Contains("num_embeddings 0"));
  REQUIRE_THROWS_WITH(nn::Embedding(5, 0), Contains("Embedding") && Contains("dim 0"));
  REQUIRE(emb.forward(IndexArray::from_shape({2, 0})).shape() == Shape{2, 0, 3});
}

TEST_CASE("positional encodings reject length > max_len and zero sizes", "[bad_input][nn][positional]") {
  nn::SinusoidalPositionalEncoding sin_pe(4, 6);
  Generator gen(4);
  nn::LearnedPositionalEncoding learned(4, 6, gen);
  REQUIRE_THROWS_WITH(sin_pe.forward(5),
                      Contains("SinusoidalPositionalEncoding") && Contains("length 5") && Contains("max_len 4"));
  REQUIRE_THROWS_WITH(learned.forward(5),
                      Contains("LearnedPositionalEncoding") && Contains("length 5") && Contains("max_len 4"));
  REQUIRE(sin_pe.forward(4).shape() == Shape{4, 6});
  REQUIRE(learned.forward(0).shape() == Shape{0, 6});
  REQUIRE(sin_pe.forward(0).shape() == Shape{0, 6});
  REQUIRE_THROWS_WITH(nn::SinusoidalPositionalEncoding(0, 6),
                      Contains("SinusoidalPositionalEncoding") && Contains("max_len"));
  REQUIRE_THROWS_WITH(nn::SinusoidalPositionalEncoding(4, 0),
                      Contains("SinusoidalPositionalEncoding") && Contains("dim"));
  REQUIRE_THROWS_WITH(nn::LearnedPositionalEncoding(0, 6),
                      Contains("LearnedPositionalEncoding") && Contains("max_len"));
}

TEST_CASE("FeedForward rejects a bad dropout, naming itself and the value", "[bad_input][nn][ffn]") {
  REQUIRE_THROWS_WITH(nn::FeedForward(nn::FeedForwardOptions(8, 16).dropout(1.f)),
                      Contains("FeedForward") && Contains("dropout 1"));
  REQUIRE_THROWS_WITH(nn::FeedForward(nn::FeedForwardOptions(8, 16).dropout(-0.1f)),
                      Contains("FeedForward") && Contains("-0.1"));
  REQUIRE_THROWS_WITH(nn::FeedForward(nn::FeedForwardOptions(8, 16).dropout(kNaN)),
                      Contains("FeedForward") && Contains("nan"));
  REQUIRE_THROWS_WITH(nn::FeedForward(nn::FeedForwardOptions(8, 0)),
                      Contains("FeedForward: d_model 8 and d_ff 0 must be positive"));
  REQUIRE_THROWS_WITH(nn::FeedForward(nn::FeedForwardOptions(0, 8)),
                      Contains("FeedForward: d_model 0 and d_ff 8 must be positive"));
}

// The error comes from the inner linear1: "Linear: input of shape (2, 3, 5) does not end in
// in_features 8", which does not say it was the FeedForward that was called.
TEST_CASE("FeedForward names itself when the input width is wrong", "[bad_input][nn][ffn][bug]") {
  Generator gen(5);
  nn::FeedForward ffn(nn::FeedForwardOptions(8, 16).dropout(0.f), gen);
  REQUIRE_THROWS_AS(ffn.forward(randn({2, 3, 5}, 1)), Error);
  REQUIRE_THROWS_WITH(ffn.forward(randn({2, 3, 5}, 1)),
                      Contains("FeedForward") && Contains("(2, 3, 5)") && Contains("8"));
}

TEST_CASE("gate_heads rejects gates of the wrong shape, naming both shapes", "[bad_input][nn][attention][gemm]") {
  Generator gen(6);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f), gen);
  const Tensor x = randn({2, 3, 8}, 7);
  for (const Shape& s : std::vector<Shape>{{3}, {1, 2}, {}, {2, 1}, {8}}) {
    INFO("gates " << shape_str(s));
    REQUIRE_THROWS_WITH(inspect::gate_heads(mha, Tensor::ones(s)),
                        Contains("gate_heads") && Contains(shape_str(s)) && Contains("(2,)"));
  }
  REQUIRE_THROWS_WITH(inspect::gate_heads(mha, Tensor()), Contains("gate_heads") && Contains("undefined"));
  const nn::HookHandle gate = inspect::gate_heads(mha, Tensor::ones({2}));
  REQUIRE_NOTHROW(mha.forward(x));
}

TEST_CASE("MultiHeadAttention rejects a bad dropout and handles empty batches and T = 0",
          "[bad_input][nn][attention][gemm]") {
  REQUIRE_THROWS_WITH(nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(8, 2).dropout(kNaN)),
                      Contains("MultiHeadAttention") && Contains("dropout nan"));
  REQUIRE_THROWS_WITH(nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(8, 2).dropout(-0.5f)),
                      Contains("MultiHeadAttention") && Contains("dropout -0.5"));
  REQUIRE_THROWS_WITH(nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(0, 2)),
                      Contains("MultiHeadAttention") && Contains("d_model 0"));
  // the norm's eps is checked with the other options
  REQUIRE_THROWS_WITH(nn::MultiHeadAttention(nn::MultiHeadAttentionOptions(8, 2).norm_eps(0.f)),
                      Contains("MultiHeadAttention: norm eps 0 must be finite and > 0"));

  Generator gen(8);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions(8, 2).dropout(0.f), gen);
  nn::AttentionMask causal;
  causal.causal = true;
  SECTION("B = 0") {
    const nn::AttentionOutput out = mha.forward(empty({0, 3, 8}), causal);
    REQUIRE(out.output.shape() == Shape{0, 3, 8});
    REQUIRE(out.weights.shape() == Shape{0, 2, 3, 3});
    sum(out.output).backward();
    REQUIRE(all_equal(mha.w_q->weight.grad(), 0.f));
  }
  SECTION("T = 0") {
    const nn::AttentionOutput out = mha.forward(empty({2, 0, 8}), causal);
    REQUIRE(out.output.shape() == Shape{2, 0, 8});
    REQUIRE(out.weights.shape() == Shape{2, 2, 0, 0});
    sum(out.output).backward();
    REQUIRE(all_equal(mha.w_o->weight.grad(), 0.f));
  }
}

// The error comes from the attention sublayer: "MultiHeadAttention: input must be (B, T, C) ...".
TEST_CASE("TransformerBlock names itself when the input width or rank is wrong", "[bad_input][nn][transformer][bug]") {
  Generator gen(9);
  nn::TransformerBlock block(nn::TransformerBlockOptions(8, 2).d_ff(16).dropout(0.f), gen);
  CHECK_THROWS_AS(block.forward(randn({2, 3, 6}, 1)), Error);
  CHECK_THROWS_WITH(block.forward(randn({2, 3, 6}, 1)),
                    Contains("TransformerBlock") && Contains("(2, 3, 6)") && Contains("8"));
  CHECK_THROWS_WITH(block.forward(randn({3, 8}, 1)), Contains("TransformerBlock") && Contains("(3, 8)"));
}

TEST_CASE("TransformerBlock rejects bad options, naming the value", "[bad_input][nn][transformer]") {
  REQUIRE_THROWS_WITH(nn::TransformerBlock(nn::TransformerBlockOptions(10, 4)),
                      Contains("d_model 10") && Contains("num_heads 4"));
  REQUIRE_THROWS_WITH(nn::TransformerBlock(nn::TransformerBlockOptions(8, 2).dropout(1.f)), Contains("dropout 1"));
  REQUIRE_THROWS_WITH(nn::TransformerBlock(nn::TransformerBlockOptions(8, 2).d_ff(0)),
                      Contains("FeedForward: d_model 8 and d_ff 0 must be positive"));
}

TEST_CASE("LanguageModel handles an empty batch and rejects bad sizes", "[bad_input][nn][lm][gemm]") {
  Generator gen(10);
  nn::LanguageModel lm(tiny_lm(), gen);
  // B = 0: empty logits, and the mean over no targets is 0
  const nn::LanguageModelOutput out = lm.forward(IndexArray::from_shape({0, 3}));
  REQUIRE(out.logits.shape() == Shape{0, 3, 7});
  Tensor loss = lm.loss(IndexArray::from_shape({0, 3}), IndexArray::from_shape({0, 3}));
  REQUIRE(loss.item() == 0.f);
  REQUIRE_NOTHROW(loss.backward());
  // all targets ignored: 0, no NaN
  Tensor ignored = lm.loss(IndexArray{{1, 2}}, IndexArray{{-100, -100}});
  REQUIRE(ignored.item() == 0.f);

  REQUIRE_THROWS_WITH(nn::LanguageModel(tiny_lm().vocab_size(0)),
                      Contains("LanguageModel") && Contains("vocab_size 0"));
  REQUIRE_THROWS_WITH(nn::LanguageModel(tiny_lm().max_len(0)), Contains("LanguageModel") && Contains("max_len 0"));
  REQUIRE_THROWS_WITH(nn::LanguageModel(tiny_lm().num_layers(0)),
                      Contains("LanguageModel") && Contains("num_layers 0"));
  REQUIRE_THROWS_WITH(nn::LanguageModel(tiny_lm().num_heads(3)), Contains("d_model 8") && Contains("num_heads 3"));
  // d_ff 0 was passed by LanguageModel::check (and so by a checkpoint's stored options) and then
  // refused by a Linear that named neither the option nor the model.
  REQUIRE_THROWS_WITH(nn::LanguageModel::check(tiny_lm().d_ff(0)), Contains("LanguageModel: d_ff 0 must be positive"));
  REQUIRE_THROWS_WITH(nn::LanguageModel(tiny_lm().d_ff(0)), Contains("LanguageModel: d_ff 0 must be positive"));
}

// LanguageModel::loss passes targets straight to cross_entropy, whose message speaks of logits
// (1, 2, 7) the caller never saw and does not name LanguageModel.
TEST_CASE("LanguageModel loss names itself for targets of the wrong shape or outside the vocabulary",
          "[bad_input][nn][lm][bug]") {
  Generator gen(11);
  nn::LanguageModel lm(tiny_lm(), gen);
  const IndexArray ids{{1, 2}};
  CHECK_THROWS_AS(lm.loss(ids, IndexArray{{1, 2, 3}}), Error);
  CHECK_THROWS_WITH(lm.loss(ids, IndexArray{{1, 2, 3}}),
                    Contains("LanguageModel") && Contains("(1, 3)") && Contains("(1, 2)"));
  CHECK_THROWS_WITH(lm.loss(ids, IndexArray{1, 2}), Contains("LanguageModel") && Contains("(2)") && Contains("(1, 2)"));
  CHECK_THROWS_WITH(lm.loss(ids, IndexArray{{1, 7}}),
                    Contains("LanguageModel") && Contains("target 7") && Contains("vocabulary"));
  CHECK_THROWS_WITH(lm.loss(ids, IndexArray{{-1, 0}}), Contains("LanguageModel") && Contains("target -1"));
}

TEST_CASE("generate rejects prompt tokens outside the vocabulary and accepts extreme temperatures",
          "[bad_input][nn][lm][generate][gemm]") {
  Generator gen(12);
  nn::LanguageModel lm(tiny_lm(), gen);
  REQUIRE_THROWS_WITH(lm.generate({1, 9}, 2), Contains("LanguageModel") && Contains("token id 9"));
  REQUIRE_THROWS_WITH(lm.generate({-3}, 2), Contains("LanguageModel") && Contains("token id -3"));
  REQUIRE(lm.is_training());  // restored after the error
  REQUIRE(lm.generate({1, 2}, 0) == std::vector<std::int64_t>{1, 2});
  Generator sample(13);
  nn::GenerateOptions inf_temp;
  inf_temp.temperature = kInf;  // uniform over the top_k tokens
  inf_temp.top_k = 100;         // more than V is all of V
  for (std::int64_t t : lm.generate({1}, 20, inf_temp, sample)) {
    REQUIRE(t >= 0);
    REQUIRE(t < 7);
  }
  nn::GenerateOptions tiny;
  tiny.temperature = 1e-30f;  // (l - l_max) / T underflows to -inf: exp gives 0, never NaN
  nn::GenerateOptions greedy;
  greedy.temperature = 0.f;
  REQUIRE(lm.generate({1, 2}, 5, tiny, sample) == lm.generate({1, 2}, 5, greedy, sample));
}

// "LanguageModel::generate: temperature nan is negative": NaN is not negative.
TEST_CASE("generate says what is wrong with a NaN temperature", "[bad_input][nn][lm][generate][bug]") {
  Generator gen(14);
  nn::LanguageModel lm(tiny_lm(), gen);
  nn::GenerateOptions nan;
  nan.temperature = kNaN;
  REQUIRE_THROWS_AS(lm.generate({1}, 3, nan), Error);
  REQUIRE_THROWS_WITH(lm.generate({1}, 3, nan),
                      Contains("generate") && Contains("temperature nan") && !Contains("is negative"));
}

// =============================================================================================
// Optimizers and schedules (the rest of their validation: test_optim.cpp)

TEST_CASE("Adam and SGD reject bad learning rates in the constructor and in set_lr", "[bad_input][optim]") {
  auto params = [] { return std::vector<Tensor>{param(Array{1.f, 2.f})}; };
  REQUIRE_THROWS_WITH(optim::Adam(params(), optim::AdamOptions(kInf)), Contains("Adam: learning rate inf"));
  REQUIRE_THROWS_WITH(optim::Adam(params(), optim::AdamOptions(-kInf)), Contains("Adam: learning rate -inf"));
  optim::Adam adam(params(), optim::AdamOptions(1e-3f));
  optim::SGD sgd(params(), optim::SGDOptions(0.1f));
  for (float bad : {-1.f, kNaN, kInf, -kInf}) {
    INFO("lr " << bad);
    REQUIRE_THROWS_WITH(adam.set_lr(bad), Contains("Adam") && Contains("learning rate"));
    REQUIRE_THROWS_WITH(sgd.set_lr(bad), Contains("SGD") && Contains("learning rate"));
  }
  REQUIRE_THROWS_WITH(adam.set_lr(kNaN), Contains("Adam: learning rate nan"));
  REQUIRE_THROWS_WITH(sgd.set_lr(kInf), Contains("SGD: learning rate inf"));
  REQUIRE(adam.lr() == 1e-3f);
  REQUIRE(sgd.lr() == 0.1f);
}

TEST_CASE("Adam eps 0, infinite weight decay and non-finite SGD settings are rejected", "[bad_input][optim]") {
  auto params = [] { return std::vector<Tensor>{param(Array{1.f, 2.f})}; };
  REQUIRE_THROWS_WITH(optim::Adam(params(), optim::AdamOptions().eps(0.f)), Contains("Adam: eps 0"));
  REQUIRE_THROWS_WITH(optim::Adam(params(), optim::AdamOptions().weight_decay(kInf)),
                      Contains("Adam: weight_decay inf"));
  REQUIRE_THROWS_WITH(optim::AdamW(params(), optim::AdamW::defaults().eps(kNaN)), Contains("AdamW: eps nan"));
  REQUIRE_THROWS_WITH(optim::SGD(params(), optim::SGDOptions(0.1f).dampening(kNaN)), Contains("SGD: dampening nan"));
  REQUIRE_THROWS_WITH(optim::SGD(params(), optim::SGDOptions(0.1f).momentum(kInf)), Contains("SGD: momentum inf"));
  REQUIRE_THROWS_WITH(optim::SGD(params(), optim::SGDOptions(0.1f).weight_decay(kNaN)),
                      Contains("SGD: weight_decay nan"));
}

TEST_CASE("an optimizer steps an empty parameter without trouble", "[bad_input][optim][empty]") {
  Tensor p = empty({0, 3});
  optim::Adam adam(std::vector<Tensor>{p}, optim::AdamOptions(0.1f));
  sum(p).backward();
  REQUIRE_NOTHROW(adam.step());
  REQUIRE(p.shape() == Shape{0, 3});
  optim::Adam again(std::vector<Tensor>{p}, optim::AdamOptions(0.1f));
  REQUIRE_NOTHROW(again.load_state_dict(adam.state_dict()));
}

// Listing one tensor twice makes step() update it twice with the same gradient (PyTorch warns
// about duplicate parameters); SGD with lr 0.1 and gradient 1 moves 1 to 0.8 instead of 0.9.
TEST_CASE("an optimizer rejects the same tensor listed twice", "[bad_input][optim][bug]") {
  Tensor p = param(Array{1.f, 2.f});
  CHECK_THROWS_WITH(optim::SGD(std::vector<Tensor>{p, p}, optim::SGDOptions(0.1f)),
                    Contains("SGD") && Contains("'1'") && Contains("'0'"));
  CHECK_THROWS_WITH(optim::Adam(NamedTensors{{"a", p}, {"b", p}}, optim::AdamOptions(0.1f)),
                    Contains("Adam") && Contains("'b'") && Contains("'a'"));
}

// Two parameters under one name give a state_dict with "a.step" twice, which the optimizer's own
// load_state_dict then rejects ("SGD: state entry 'a.step' appears twice"): the round trip breaks.
TEST_CASE("an optimizer rejects two parameters with the same name", "[bad_input][optim][bug]") {
  Tensor p = param(Array{1.f, 2.f}), q = param(Array{3.f});
  CHECK_THROWS_WITH(optim::SGD(NamedTensors{{"a", p}, {"a", q}}, optim::SGDOptions(0.1f).momentum(0.9f)),
                    Contains("SGD") && Contains("'a'") && Contains("twice"));
}

TEST_CASE("clip_grad_norm rejects an infinite max_norm and survives empty lists and huge gradients",
          "[bad_input][optim][clip]") {
  Tensor p = param(Array{1.f, 1.f});
  set_grad(p, Array{3.f, 4.f});
  // unlike torch.nn.utils.clip_grad_norm_, max_norm = inf is an error, not "do not clip"
  REQUIRE_THROWS_WITH(optim::clip_grad_norm(std::vector<Tensor>{p}, kInf),
                      Contains("clip_grad_norm") && Contains("max_norm inf"));
  REQUIRE(p.grad()(0) == 3.f);
  REQUIRE(optim::clip_grad_norm(std::vector<Tensor>{}, 1.f) == 0.f);
  REQUIRE(optim::clip_grad_norm(std::vector<Tensor>{Tensor()}, 1.f) == 0.f);  // undefined handles are skipped
  // gradients whose squares overflow float: the norm is summed in double and stays finite
  Tensor big = param(Array{1.f, 1.f});
  set_grad(big, Array{2e38f, 2e38f});
  const float norm = optim::clip_grad_norm(std::vector<Tensor>{big}, 1.f);
  REQUIRE(std::isfinite(norm));
  REQUIRE(norm == Approx(2e38 * std::sqrt(2.0)).epsilon(1e-5));
  REQUIRE(big.grad()(0) == Approx(1.0 / std::sqrt(2.0)).epsilon(1e-4));
}

TEST_CASE("LrSchedule rejects a non-finite min_lr and stays finite at extreme steps", "[bad_input][optim][schedule]") {
  REQUIRE_THROWS_WITH(optim::LrSchedule(optim::ScheduleOptions(0.1f).min_lr(kNaN)), Contains("LrSchedule: min_lr nan"));
  REQUIRE_THROWS_WITH(optim::LrSchedule(optim::ScheduleOptions(0.1f).min_lr(kInf)), Contains("LrSchedule: min_lr inf"));
  REQUIRE_THROWS_WITH(optim::LrSchedule(optim::ScheduleOptions(-kInf)), Contains("LrSchedule: base_lr -inf"));
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  optim::LrSchedule cosine(
      optim::ScheduleOptions(0.1f).warmup_steps(10).total_steps(20).decay(optim::Decay::cosine).min_lr(0.01f));
  REQUIRE(cosine.lr(huge) == Approx(0.01f));
  optim::LrSchedule long_warmup(optim::ScheduleOptions(0.1f).warmup_steps(huge));
  REQUIRE(std::isfinite(long_warmup.lr(huge - 1)));
  REQUIRE(long_warmup.lr(huge) == 0.1f);
  // constant decay needs no total_steps, so total_steps < warmup_steps is accepted there
  optim::LrSchedule constant(optim::ScheduleOptions(0.1f).warmup_steps(5).total_steps(2));
  REQUIRE(constant.lr(10) == 0.1f);
}

// =============================================================================================
// Checkpoints and optimizer state (the rest: test_checkpoint.cpp, test_optim.cpp)

TEST_CASE("weights::load_state_dict on a single layer names the parameter and both shapes", "[bad_input][checkpoint]") {
  Generator gen(15);
  nn::Linear lin(2, 3, true, gen);
  const NamedArrays before = weights::state_dict(lin);
  NamedArrays wrong = before;
  wrong[0].second = Array::from_shape({2, 3});
  REQUIRE_THROWS_WITH(weights::load_state_dict(lin, wrong),
                      Contains("load_state_dict") && Contains("'weight'") && Contains("(2, 3)") && Contains("(3, 2)"));
  NamedArrays missing = before;
  missing.pop_back();
  REQUIRE_THROWS_WITH(weights::load_state_dict(lin, missing),
                      Contains("load_state_dict") && Contains("missing parameter 'bias'"));
  REQUIRE_THROWS_WITH(weights::load_state_dict(lin, NamedArrays{}), Contains("missing parameter 'weight'"));
  NamedArrays extra = before;
  extra.emplace_back("x", Array{1.f});
  REQUIRE_THROWS_WITH(weights::load_state_dict(lin, extra),
                      Contains("load_state_dict") && Contains("unexpected entry 'x'"));
  REQUIRE(lin.weight.value() == before[0].second);
}

// A negative exp_avg_sq (impossible from a real run, so a corrupt checkpoint) is accepted, and the
// next step takes sqrt of it: the parameter silently becomes NaN.
TEST_CASE("Adam load_state_dict rejects a negative or non-finite exp_avg_sq", "[bad_input][checkpoint][optim][bug]") {
  Tensor p = param(Array{1.f, 2.f});
  optim::Adam adam(NamedTensors{{"p", p}}, optim::AdamOptions(0.1f));
  const NamedArrays bad = {{"p.step", Array(1.f)}, {"p.exp_avg", Array{0.f, 0.f}}, {"p.exp_avg_sq", Array{-1.f, 0.f}}};
  bool threw = false;
  try {
    adam.load_state_dict(bad);
  } catch (const Error& e) {
    threw = true;
    CHECK_THAT(std::string(e.what()), Contains("Adam") && Contains("'p.exp_avg_sq'"));
  }
  if (!threw) {
    set_grad(p, Array{1.f, 1.f});
    adam.step();
    INFO("parameter after one step from the loaded state: " << p.value());
    CHECK(all_finite(p.value()));
  }
  CHECK(threw);
}

TEST_CASE("rms_norm refuses a scalar, a gamma of the wrong shape, a bad eps and an undefined input",
          "[bad_input][ops][rms_norm]") {
  const Tensor x = randn({2, 4}, 1);
  REQUIRE_THROWS_AS(rms_norm(Tensor::scalar(1.f), Tensor()), Error);
  REQUIRE_THROWS_WITH(rms_norm(Tensor::scalar(1.f), Tensor()),
                      Contains("rms_norm: input must have at least one axis, got a scalar"));
  for (const Shape& s : std::vector<Shape>{{3}, {4, 1}, {1, 4}, {}}) {
    INFO("gamma " << shape_str(s));
    REQUIRE_THROWS_WITH(rms_norm(x, Tensor(Array::from_shape(s))),
                        Contains("rms_norm: gamma of shape " + shape_str(s) +
                                 " does not match the normalized size (4,) of input (2, 4)"));
  }
  REQUIRE_THROWS_WITH(rms_norm(x, Tensor(), 0.f), Contains("rms_norm: eps must be finite and positive, got 0"));
  REQUIRE_THROWS_WITH(rms_norm(x, Tensor(), -1e-5f), Contains("rms_norm: eps must be finite and positive, got -1e-05"));
  REQUIRE_THROWS_WITH(rms_norm(x, Tensor(), kNaN), Contains("rms_norm: eps must be finite and positive, got nan"));
  REQUIRE_THROWS_WITH(rms_norm(x, Tensor(), kInf), Contains("rms_norm: eps must be finite and positive, got inf"));
  REQUIRE_THROWS_WITH(rms_norm(Tensor(), Tensor()), Contains("rms_norm") && Contains("undefined"));
  REQUIRE_NOTHROW(rms_norm(x, Tensor::ones({4})));
}

TEST_CASE("rms_norm of an empty batch, of zero rows and of huge values is defined", "[bad_input][ops][rms_norm]") {
  for (const Shape& s : std::vector<Shape>{{0, 4}, {2, 0, 4}}) {
    INFO("shape " << shape_str(s));
    Tensor x = empty(s);
    Tensor gamma = Tensor::ones({4}, true);
    Tensor y = rms_norm(x, gamma);
    REQUIRE(y.shape() == s);
    sum(y).backward();
    REQUIRE(gamma.grad().shape() == Shape{4});
    REQUIRE(all_equal(gamma.grad(), 0.f));
  }
  REQUIRE(rms_norm(empty({2, 0}), Tensor()).shape() == Shape{2, 0});  // C = 0: nothing to divide
  // A row of zeros: rstd = 1 / sqrt(eps), y = 0, dx = g gamma / sqrt(eps), finite.
  Tensor zeros(Array({{0.f, 0.f, 0.f}, {1.f, 2.f, 2.f}}), true);
  Tensor gamma(Array({2.f, 1.f, -1.f}), true);
  Tensor y = rms_norm(zeros, gamma, 0.25f);
  REQUIRE(y.value()(0, 0) == 0.f);
  REQUIRE(y.value()(0, 2) == 0.f);
  sum(y).backward();
  REQUIRE(zeros.grad()(0, 0) == Approx(4.f));
  REQUIRE(zeros.grad()(0, 2) == Approx(-2.f));
  // |x| past about 1.8e19: x^2 overflows float, so rstd = 0 and the row is 0, with gradients 0
  // (the float32 formula x * rsqrt(mean(x^2) + eps) gives the same in PyTorch).
  Tensor huge(Array({{1e20f, -1.f}, {1e18f, -1e18f}}), true);
  Tensor z = rms_norm(huge, Tensor());
  REQUIRE(z.value()(0, 0) == 0.f);
  REQUIRE(z.value()(0, 1) == 0.f);
  REQUIRE(z.value()(1, 0) == Approx(1.f));  // 1e36 does not overflow
  REQUIRE(z.value()(1, 1) == Approx(-1.f));
  sum(z * Tensor(Array({{1.f, 1.f}, {1.f, 0.f}}))).backward();
  REQUIRE(huge.grad()(0, 0) == 0.f);
  REQUIRE(huge.grad()(0, 1) == 0.f);
  REQUIRE(std::isfinite(huge.grad()(1, 0)));
}

TEST_CASE("RMSNorm rejects a wrong width, eps <= 0, NaN or infinite and zero features", "[bad_input][nn][rms_norm]") {
  nn::RMSNorm norm(4);
  REQUIRE(norm.eps() == 1e-6f);
  REQUIRE_THROWS_WITH(norm.forward(randn({2, 5}, 1)),
                      Contains("RMSNorm: input of shape (2, 5) does not end in the normalized size 4"));
  REQUIRE_THROWS_WITH(norm.forward(Tensor::scalar(1.f)),
                      Contains("RMSNorm: input of shape () does not end in the normalized size 4"));
  REQUIRE_THROWS_WITH(norm.forward(Tensor()), Contains("RMSNorm") && Contains("undefined"));
  REQUIRE_THROWS_WITH(nn::RMSNorm(4, 0.f), Contains("RMSNorm: eps must be finite and positive, got 0"));
  REQUIRE_THROWS_WITH(nn::RMSNorm(4, -1e-5f), Contains("RMSNorm: eps must be finite and positive, got -1e-05"));
  REQUIRE_THROWS_WITH(nn::RMSNorm(4, kNaN), Contains("RMSNorm: eps must be finite and positive, got nan"));
  REQUIRE_THROWS_WITH(nn::RMSNorm(4, kInf), Contains("RMSNorm: eps must be finite and positive, got inf"));
  REQUIRE_THROWS_WITH(nn::RMSNorm(0), Contains("RMSNorm: features must be positive"));
  REQUIRE(norm.forward(empty({0, 4})).shape() == Shape{0, 4});
}
