// Gradient-ready listeners: when a watched leaf's gradient is handed over (after the last op reading
// it ran, before the pass ends), what a listener sees of a pass that fails, threads, and misuse.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "xgrad/core/autograd/gradient_ready.hpp"
#include "xgrad/core/autograd/ops.hpp"
#include "xgrad/core/autograd/tape.hpp"
#include "xgrad/core/error.hpp"

using namespace xgrad;

namespace {

using Log = std::vector<std::string>;

// a * b, whose backward writes its name into the log when it runs.
Tensor traced_mul(const char* name, const Tensor& a, const Tensor& b, Log& log) {
  return record("traced_mul", a.value() * b.value(), {a, b}, [name, &log](GradContext& ctx) {
    log.push_back(name);
    if (ctx.needs(0)) ctx.accumulate(0, Array(ctx.grad_out() * ctx.input(1)));
    if (ctx.needs(1)) ctx.accumulate(1, Array(ctx.grad_out() * ctx.input(0)));
  });
}

// Writes every event into a log, naming the leaf by `names`, and keeps the gradients it saw.
struct Recorder : GradientReadyListener {
  Recorder(Log& log, std::vector<std::string> names) : log(log), names(std::move(names)) {}
  void gradient_ready(std::size_t index, Array& grad) override {
    log.push_back("ready " + names.at(index));
    seen[names.at(index)].push_back(grad);
    if (on_ready) on_ready(index, grad);
  }
  void pass_ended() override {
    log.push_back("ended " + tag);
    if (on_end) on_end();
  }
  void pass_failed() noexcept override { log.push_back("failed " + tag); }
  const Array& gradient(const std::string& name, std::size_t pass) const { return seen.at(name).at(pass); }
  Log& log;
  std::vector<std::string> names;
  std::string tag;
  std::map<std::string, std::vector<Array>> seen;
  std::function<void(std::size_t, Array&)> on_ready;
  std::function<void()> on_end;
};

}  // namespace

TEST_CASE("a watched leaf is ready after the last op reading it ran, and before the pass ends", "[gradient_ready]") {
  Tensor w0(Array{1.f, 2.f}, true), w1(Array{3.f, 4.f}, true), w2(Array{5.f, 6.f}, true);
  w0.set_name("w0");
  Log log;
  // Recording order A (reads w0, w1), B (reads w2), C (reads w1): the sweep runs C, B, A.
  const Tensor a = traced_mul("A", w0, w1, log);
  const Tensor b = traced_mul("B", a, w2, log);
  const Tensor loss = sum(traced_mul("C", b, w1, log));
  Recorder rec(log, {"w0", "w2"});  // w1 has no listener and no hook
  bool w1_at_ready = true, w1_at_end = false;
  rec.on_ready = [&](std::size_t, Array&) { w1_at_ready = w1_at_ready && !w1.has_grad(); };
  rec.on_end = [&] { w1_at_end = w1.has_grad(); };
  const GradientWatch watch = watch_gradients({w0, w2}, rec);
  REQUIRE(watch.active());
  loss.backward();
  // w2 is final once B ran (A does not read it); w0 once A ran; w1, unwatched, at the pass's end.
  REQUIRE(log == Log{"C", "B", "ready w2", "A", "ready w0", "ended "});
  REQUIRE(w1_at_ready);
  REQUIRE(w1_at_end);
  // L = sum(w0 * w1 * w2 * w1): dL/dw0 = w1^2 w2, dL/dw2 = w0 w1^2, dL/dw1 = 2 w0 w1 w2
  REQUIRE(rec.gradient("w0", 0) == Array{45.f, 96.f});
  REQUIRE(rec.gradient("w2", 0) == Array{9.f, 32.f});
  REQUIRE(w0.grad() == Array{45.f, 96.f});
  REQUIRE(w1.grad() == Array{30.f, 96.f});
}

TEST_CASE("a listener sees each pass's own gradient after the hooks, and what it leaves is added", "[gradient_ready]") {
  Tensor w(Array{1.f, -2.f}, true);
  Log log;
  w.register_hook([&](Array& g) {
    log.push_back("hook");
    g *= 2.f;
  });
  Recorder rec(log, {"w"});
  rec.on_ready = [](std::size_t, Array& g) { g += 1.f; };
  GradientWatch watch = watch_gradients({w}, rec);
  sum(w * 3.f).backward();
  sum(w * 3.f).backward();
  REQUIRE(log == Log{"hook", "ready w", "ended ", "hook", "ready w", "ended "});
  // each pass: 3 from the op, doubled by the hook, then 1 added by the listener
  REQUIRE(rec.gradient("w", 0) == Array{6.f, 6.f});
  REQUIRE(rec.gradient("w", 1) == Array{6.f, 6.f});
  REQUIRE(w.grad() == Array{14.f, 14.f});

  // A leaf that is the root is ready at once; retain_graph passes are passes like any other.
  log.clear();
  w.zero_grad();
  w.backward(Array{1.f, 1.f});
  REQUIRE(log == Log{"hook", "ready w", "ended "});
  log.clear();
  const Tensor loss = sum(w * w);
  loss.backward(true);
  loss.backward();
  REQUIRE(log == Log{"hook", "ready w", "ended ", "hook", "ready w", "ended "});

  // After reset the listener hears nothing more.
  watch.reset();
  REQUIRE_FALSE(watch.active());
  log.clear();
  sum(w * 3.f).backward();
  REQUIRE(log == Log{"hook"});
}

TEST_CASE("listeners hear of a pass in the order of their first ready leaf, callbacks run after them",
          "[gradient_ready]") {
  Tensor w0(Array{1.f}, true), w1(Array{2.f}, true);
  Log log;
  Recorder first(log, {"w1"}), second(log, {"w0"});
  first.tag = "first";
  second.tag = "second";
  // Queued from a listener: runs after every listener heard pass_ended.
  first.on_ready = [&](std::size_t, Array&) { queue_backward_callback([&] { log.push_back("callback"); }); };
  const GradientWatch a = watch_gradients({w0}, second);
  const GradientWatch b = watch_gradients({w1}, first);
  sum(tanh(w0) * w1).backward();  // w1 is read by the last op only: ready first
  REQUIRE(log == Log{"ready w1", "ready w0", "ended first", "ended second", "callback"});

  // A pass that reaches none of a listener's leaves does not call it.
  log.clear();
  sum(w1 * 2.f).backward();
  REQUIRE(log == Log{"ready w1", "ended first", "callback"});
}

TEST_CASE("a pass that fails midway: ready leaves keep their gradients, the listener hears pass_failed",
          "[gradient_ready]") {
  Tensor w0(Array{1.f, 2.f}, true), w1(Array{3.f, 4.f}, true);
  Log log;
  Recorder rec(log, {"w0", "w1"});
  bool callback_ran = false;
  rec.on_ready = [&](std::size_t, Array&) { queue_backward_callback([&] { callback_ran = true; }); };
  const GradientWatch watch = watch_gradients({w0, w1}, rec);
  {
    Tensor h = w0 * 2.f;
    h.register_hook([&](Array&) { fail("a hook that fails"); });
    // w1 is final (and handed over) before h's gradient arrives and its hook fails.
    REQUIRE_THROWS_WITH(sum(h * w1).backward(), "a hook that fails");
  }
  REQUIRE(log == Log{"ready w1", "failed "});
  REQUIRE_FALSE(callback_ran);
  REQUIRE(w1.grad() == Array{2.f, 4.f});
  REQUIRE_FALSE(w0.has_grad());

  // A failure before any watched leaf is ready: the listener hears nothing of that pass.
  log.clear();
  {
    Tensor h = w0 * w1;
    h.register_hook([&](Array&) { fail("fails first"); });
    REQUIRE_THROWS_WITH(sum(h).backward(), "fails first");
  }
  REQUIRE(log.empty());

  // The next pass is whole.
  log.clear();
  w0.zero_grad();
  w1.zero_grad();
  sum(w0 * w1).backward();
  REQUIRE(log == Log{"ready w0", "ready w1", "ended "});
  REQUIRE(callback_ran);
  REQUIRE(w0.grad() == Array{3.f, 4.f});
  REQUIRE(w1.grad() == Array{1.f, 2.f});
}

TEST_CASE("a listener that throws fails the pass: the others hear pass_failed, the thrower once", "[gradient_ready]") {
  Tensor w0(Array{1.f}, true), w1(Array{2.f}, true);
  Log log;
  Recorder a(log, {"w1"}), b(log, {"w0"});
  a.tag = "a";
  b.tag = "b";
  const GradientWatch wa = watch_gradients({w1}, a);
  const GradientWatch wb = watch_gradients({w0}, b);

  SECTION("from gradient_ready: the leaf's gradient is not added") {
    b.on_ready = [](std::size_t, Array&) { throw std::runtime_error("listener b refuses"); };
    REQUIRE_THROWS_WITH(sum(tanh(w0) * w1).backward(), "listener b refuses");
    REQUIRE(log == Log{"ready w1", "ready w0", "failed a", "failed b"});
    REQUIRE(w1.has_grad());
    REQUIRE_FALSE(w0.has_grad());
  }
  SECTION("from pass_ended: the listeners not yet told hear pass_failed, callbacks do not run") {
    bool callback_ran = false;
    a.on_ready = [&](std::size_t, Array&) { queue_backward_callback([&] { callback_ran = true; }); };
    a.on_end = [] { throw std::runtime_error("listener a cannot end"); };
    REQUIRE_THROWS_WITH(sum(tanh(w0) * w1).backward(), "listener a cannot end");
    REQUIRE(log == Log{"ready w1", "ready w0", "ended a", "failed b"});
    REQUIRE_FALSE(callback_ran);
  }
  SECTION("by changing the gradient's shape") {
    b.on_ready = [](std::size_t, Array& g) { g = Array{1.f, 2.f, 3.f}; };
    w0.set_name("w0");
    REQUIRE_THROWS_WITH(sum(tanh(w0) * w1).backward(),
                        "backward: a gradient-ready listener changed the gradient of 'w0' (leaf 0 of its watch) from "
                        "shape (1) to (3)");
    REQUIRE(log == Log{"ready w1", "ready w0", "failed a", "failed b"});
  }
  // Either way the engine recovers.
  log.clear();
  a.on_ready = b.on_ready = nullptr;
  a.on_end = nullptr;
  sum(tanh(w0) * w1).backward();
  REQUIRE(log == Log{"ready w1", "ready w0", "ended a", "ended b"});
}

TEST_CASE("in anomaly mode a listener sees only a checked gradient", "[gradient_ready][anomaly]") {
  Tensor w(Array{1.f, 2.f}, true);
  w.set_name("w");
  w.register_hook([](Array& g) { g(1) = std::numeric_limits<float>::quiet_NaN(); });
  Log log;
  Recorder rec(log, {"w"});
  const GradientWatch watch = watch_gradients({w}, rec);
  AnomalyGuard anomaly;
  REQUIRE_THROWS_WITH(sum(w * 2.f).backward(), Catch::Contains("anomaly: the gradient reaching 'w' is nan at flat "
                                                               "position 1 (after its hooks ran)"));
  REQUIRE(log.empty());
}

TEST_CASE("a watch ended inside a pass on its thread hears nothing more of it", "[gradient_ready]") {
  Tensor w0(Array{1.f}, true), w1(Array{2.f}, true);
  Log log;
  Recorder rec(log, {"w0", "w1"});
  GradientWatch watch = watch_gradients({w0, w1}, rec);
  rec.on_ready = [&](std::size_t, Array&) { watch.reset(); };
  sum(tanh(w0) * w1).backward();
  REQUIRE(log == Log{"ready w1"});
  REQUIRE(w0.grad()(0) == Approx(2.f * (1.f - std::tanh(1.f) * std::tanh(1.f))));  // still delivered

  // A moved handle carries the watch; the moved-from one watches nothing.
  log.clear();
  rec.on_ready = nullptr;
  GradientWatch moved = watch_gradients({w0}, rec);
  GradientWatch other = std::move(moved);
  REQUIRE_FALSE(moved.active());
  sum(w0 * 2.f).backward();
  REQUIRE(log == Log{"ready w0", "ended "});
  other = GradientWatch();
  log.clear();
  sum(w0 * 2.f).backward();
  REQUIRE(log.empty());
}

TEST_CASE("two threads each run their own passes: a shared listener hears each pass on its thread",
          "[gradient_ready][threads]") {
  constexpr int kPasses = 30;
  Tensor w(Array(xt::ones<float>({256})), true);
  struct PerThread : GradientReadyListener {
    std::mutex mutex;
    std::map<std::thread::id, Log> log;
    std::map<std::thread::id, std::vector<Array>> grads;
    std::atomic<int> inside{0}, overlaps{0};
    void gradient_ready(std::size_t index, Array& grad) override {
      if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);  // called under the leaf's mutex
      {
        std::lock_guard<std::mutex> lock(mutex);
        log[std::this_thread::get_id()].push_back("ready " + std::to_string(index));
        grads[std::this_thread::get_id()].push_back(grad);
      }
      inside.fetch_sub(1);
    }
    void pass_ended() override {
      std::lock_guard<std::mutex> lock(mutex);
      log[std::this_thread::get_id()].push_back("ended");
    }
  } listener;
  const GradientWatch watch = watch_gradients({w}, listener);
  std::map<int, std::thread::id> ids;
  std::vector<std::thread> threads;
  std::mutex ids_mutex;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      {
        std::lock_guard<std::mutex> lock(ids_mutex);
        ids[t] = std::this_thread::get_id();
      }
      const Tensor x(Array(xt::ones<float>({256}) * static_cast<float>(t + 1)));
      for (int i = 0; i < kPasses; ++i) sum(tanh(x) * w * x).backward();
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(listener.overlaps.load() == 0);
  for (int t = 0; t < 2; ++t) {
    const float x = static_cast<float>(t + 1);
    Log want;
    for (int i = 0; i < kPasses; ++i) {
      want.push_back("ready 0");
      want.push_back("ended");
    }
    REQUIRE(listener.log[ids[t]] == want);
    // each pass's own gradient, tanh(x) x, not a sum of passes nor the other thread's
    for (const Array& g : listener.grads[ids[t]]) {
      REQUIRE(g.size() == 256);
      REQUIRE(g(0) == Approx(std::tanh(x) * x).epsilon(1e-5));
      REQUIRE(g(255) == Approx(std::tanh(x) * x).epsilon(1e-5));
    }
  }
  const float total = kPasses * (std::tanh(1.f) * 1.f + std::tanh(2.f) * 2.f);
  REQUIRE(w.grad()(0) == Approx(total).epsilon(1e-5));
}

TEST_CASE("watch_gradients refuses what it cannot watch, naming the leaf", "[gradient_ready][bad_input]") {
  Tensor w(Array{1.f, 2.f}, true), c(Array{1.f, 2.f});
  w.set_name("w");
  Log log;
  Recorder rec(log, {"a", "b"});
  REQUIRE_THROWS_WITH(watch_gradients({w, Tensor()}, rec), "watch_gradients: leaf 1 is an undefined tensor");
  REQUIRE_THROWS_WITH(watch_gradients({c}, rec),
                      "watch_gradients: leaf 0 does not require grad, no gradient will reach it");
  REQUIRE_THROWS_WITH(watch_gradients({w, w * 2.f}, rec),
                      "watch_gradients: leaf 1 was computed by an op, not a leaf (watch the parameters)");
  REQUIRE_THROWS_WITH(watch_gradients({w, w}, rec), "watch_gradients: leaf 1 ('w') is listed twice (also as leaf 0)");
  const GradientWatch watch = watch_gradients({w}, rec);
  Tensor v(Array{3.f}, true);
  REQUIRE_THROWS_WITH(watch_gradients({v}, rec),
                      "watch_gradients: the listener already has a watch (give it one list of every leaf)");
  // From inside a pass (a hook here).
  Recorder late(log, {"v"});
  std::string error;
  v.register_hook([&](Array&) {
    try {
      const GradientWatch inner = watch_gradients({v}, late);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  sum(v * 2.f).backward();
  REQUIRE(error ==
          "watch_gradients: called from inside a backward pass on this thread (from a hook or a listener); start "
          "watching before backward");
  // The refused calls left no watch behind: only w is watched, once.
  log.clear();
  sum(w * v).backward();
  REQUIRE(log == Log{"ready a", "ended "});
}
