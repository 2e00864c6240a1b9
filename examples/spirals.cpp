// Trains a two-layer perceptron on three interleaved spirals with nothing but the core:
// tensors, ops, backward and a hand-written SGD step. Shapes: N points, 2 inputs, H hidden, K classes.
#include <cmath>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/argmax.hpp"
#include "common/cli.hpp"
#include "common/memory.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

struct Dataset {
  Array x;       // (N, 2)
  IndexArray y;  // (N,)
};

// K spiral arms of n points each; arm k winds from the centre outwards, with angular noise.
Dataset make_spirals(std::size_t n, std::size_t k, Generator& gen) {
  Dataset d{Array::from_shape({n * k, 2}), IndexArray::from_shape({n * k})};
  for (std::size_t c = 0; c < k; ++c) {
    for (std::size_t i = 0; i < n; ++i) {
      const float r = static_cast<float>(i) / static_cast<float>(n);
      const float t = 4.f * (static_cast<float>(c) + r) + 0.2f * gen.normal();
      d.x(c * n + i, 0) = r * std::sin(t);
      d.x(c * n + i, 1) = r * std::cos(t);
      d.y(c * n + i) = static_cast<std::int64_t>(c);
    }
  }
  return d;
}

// PyTorch's default Linear initialization: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
Tensor uniform_param(const Shape& shape, std::size_t fan_in, Generator& gen) {
  const float bound = 1.f / std::sqrt(static_cast<float>(fan_in));
  return Tensor(gen.uniform(shape, -bound, bound), true);
}

double accuracy(const Array& logits, const IndexArray& y) {
  std::size_t hit = 0;
  const std::size_t k = logits.shape()[1];
  for (std::size_t i = 0; i < y.size(); ++i) {
    hit += static_cast<std::int64_t>(metrics::argmax(logits.data() + i * k, k)) == y(i);
  }
  return static_cast<double>(hit) / static_cast<double>(y.size());
}

void fit(std::size_t steps, std::size_t hidden, std::size_t points, float lr, float momentum, std::uint64_t seed) {
  // (3 points x hidden) activations of the hidden layer and its gradient dominate.
  cli::check_memory(static_cast<double>(points) * 3 * static_cast<double>(hidden) * 4 * 8, "--points x --hidden");

  const std::size_t classes = 3;
  Generator gen(seed);
  const Dataset data = make_spirals(points, classes, gen);
  const Tensor x(data.x);

  std::vector<Tensor> params = {uniform_param({2, hidden}, 2, gen), uniform_param({hidden}, 2, gen),
                                uniform_param({hidden, classes}, hidden, gen), uniform_param({classes}, hidden, gen)};
  std::vector<Array> velocity;
  for (const Tensor& p : params) velocity.push_back(xt::zeros<float>(p.shape()));

  auto forward = [&](const Tensor& in) {
    const Tensor h = tanh(matmul(in, params[0]) + params[1]);  // (N, H)
    return matmul(h, params[2]) + params[3];                   // (N, K)
  };

  std::printf("spirals: %zu points, %zu classes, hidden %zu, %zu steps\n", points * classes, classes, hidden, steps);
  for (std::size_t step = 1; step <= steps; ++step) {
    const Tensor logits = forward(x);
    const Tensor loss = cross_entropy(logits, data.y);
    for (Tensor& p : params) p.zero_grad();
    loss.backward();
    optim::check_finite(step, loss.item(),
                        {{"w1", params[0]}, {"b1", params[1]}, {"w2", params[2]}, {"b2", params[3]}});
    // SGD with momentum, as torch.optim.SGD: v = m v + g; p -= lr v
    for (std::size_t i = 0; i < params.size(); ++i) {
      velocity[i] = momentum * velocity[i] + params[i].grad();
      params[i].mutable_value() -= lr * velocity[i];
    }
    if (step == 1 || step % (steps / 10 ? steps / 10 : 1) == 0) {
      std::printf("step %5zu  loss %.4f  accuracy %.3f\n", step, loss.item(), accuracy(logits.value(), data.y));
    }
  }
  NoGradGuard no_grad;
  const double acc = accuracy(forward(x).value(), data.y);
  std::printf("final training accuracy %.3f\n", acc);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Fit a two-layer perceptron to three spirals with xgrad's core autograd.", "spirals"};
  std::size_t steps = 1000, hidden = 64, points = 100;
  float lr = 0.5f, momentum = 0.9f;
  std::uint64_t seed = 0;
  app.add_option("--steps", steps, "training steps (full batch)")->transform(cli::count(1, cli::kMaxSteps));
  app.add_option("--hidden", hidden, "hidden units")->transform(cli::count(1, 1 << 16));
  app.add_option("--points", points, "points per spiral arm")->transform(cli::count(1, 1 << 20));
  app.add_option("--lr", lr, "SGD learning rate")->check(cli::real(0, 1e6, true));
  app.add_option("--momentum", momentum, "SGD momentum")->check(cli::real(0, 0.999));
  app.add_option("--seed", seed, "seed for data and weights")->transform(cli::seed());
  int threads = 1;
  cli::add_threads(app, threads);
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("spirals", [&] {
    xgrad::set_num_threads(threads);
    fit(steps, hidden, points, lr, momentum, seed);
  });
}
