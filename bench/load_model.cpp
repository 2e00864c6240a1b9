// How long a Hugging Face folder of any family load_hf_model reads takes to load, and the memory
// it takes, against reading the same safetensors bytes from the page cache into one buffer reused
// across reads (the floor: what any loader must at least do). The first load gives the peak
// resident memory it adds (VmHWM, lowered to VmRSS through /proc/self/clear_refs just before, minus
// that VmRSS) as a multiple of the weights' bytes; then the two alternate --reps times on a warm
// page cache and the table quotes medians. With --use, the loaded model then runs a forward of
// 1 x 128 tokens, a greedy generate of 32 tokens after 16, and two AdamW training steps of 1 x 128
// tokens, each timed once with the peak resident memory after it. The first load, in a process that
// has not yet freed memory to reuse, is timed too: its weights land on pages new to the process.
// --map-file loads with HfLoadOptions().map_file(true) throughout.
//     build/bench/bench_load_model DIR [--reps 5] [--threads 1] [--use] [--map-file]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/cli.hpp"
#include "peak_memory.hpp"
#include "xgrad/xgrad.hpp"

using namespace xgrad;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

template <typename F>
double seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  std::size_t reps = 5, threads = 1;
  bool use = false, map = false;
  CLI::App app{"load time and peak memory of a Hugging Face folder, against reading its bytes", "bench_load_model"};
  app.add_option("dir", dir, "a folder with config.json and model.safetensors")->required();
  app.add_option("--reps", reps, "timed loads of each")->transform(cli::count(1, 1000))->capture_default_str();
  app.add_option("--threads", threads, "kernel threads")->transform(cli::count(1, 256))->capture_default_str();
  app.add_flag("--use", use, "then time a forward, a generate and a training step of the loaded model");
  app.add_flag("--map-file", map, "load with HfLoadOptions().map_file(true): F32 weights over the mapped file");
  if (const auto code = cli::parse(app, argc, argv)) return *code;
  return cli::run("bench_load_model", [&] {
    set_num_threads(threads);
    const std::string file = dir + "/model.safetensors";
    bench::reset_peak();  // the peak (VmHWM) lowered to the resident size, so that only the load below counts
    const long before = bench::status_kib("VmRSS"), anon_before = bench::status_kib("RssAnon");
    const weights::HfLoadOptions options = weights::HfLoadOptions().map_file(map);
    std::size_t params = 0;
    double first_load = 0, anon_rise = 0;  // the process's own pages (RssAnon), without the file's shared ones
    {
      std::shared_ptr<nn::LanguageModel> model;
      first_load = seconds([&] { model = weights::load_hf_model(dir, options); });
      for (const auto& p : model->parameters()) params += p.size();
      anon_rise = static_cast<double>(bench::status_kib("RssAnon") - anon_before) * 1024.0;
    }
    const double peak_rise = static_cast<double>(bench::status_kib("VmHWM") - before) * 1024.0;
    std::vector<char> bytes;  // one buffer for every read: a read pays no page faults after the first
    const auto read_all = [&] {
      std::ifstream in(file, std::ios::binary);
      bytes.resize(static_cast<std::size_t>(in.seekg(0, std::ios::end).tellg()));
      in.seekg(0).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    };
    read_all();
    const double file_bytes = static_cast<double>(bytes.size());
    std::vector<double> load, read;
    for (std::size_t r = 0; r < reps; ++r) {
      read.push_back(seconds(read_all));
      load.push_back(seconds([&] { weights::load_hf_model(dir, options); }));
    }
    const double weights = 4.0 * static_cast<double>(params);
    std::printf("%s: %zu parameters (%.0f MiB as F32), file %.0f MiB, %zu thread(s)%s\n", dir.c_str(), params,
                weights / 1048576.0, file_bytes / 1048576.0, threads, map ? ", map_file" : "");
    std::printf("| | seconds (median of %zu) | GB/s of the file |\n|---|---:|---:|\n", reps);
    std::printf("| read the file into one buffer | %.3f | %.2f |\n", median(read), file_bytes / median(read) / 1e9);
    std::printf("| weights::load_hf_model | %.3f | %.2f |\n", median(load), file_bytes / median(load) / 1e9);
    std::printf(
        "load / read: %.1fx; the first load: %.3f s, the peak resident memory it added: %.0f MiB (%.2fx the "
        "weights' F32 bytes), of it the process's own (RssAnon): %.0f MiB\n",
        median(load) / median(read), first_load, peak_rise / 1048576.0, peak_rise / weights, anon_rise / 1048576.0);
    if (!use) return;
    const auto model = weights::load_hf_model(dir, options);
    const std::size_t V = model->options().vocab_size();
    Generator gen(1);
    IndexArray ids = IndexArray::from_shape({1, 128});
    for (auto& id : ids) id = static_cast<std::int64_t>(gen.below(V));
    auto peak_mib = [] { return static_cast<double>(bench::status_kib("VmHWM")) / 1024.0; };
    const double forward = seconds([&] {
      NoGradGuard no_grad;
      model->forward(ids, nn::Attentions::none);
    });
    std::printf("| forward, 1 x 128 tokens | %.3f s | peak %.0f MiB |\n", forward, peak_mib());
    const std::vector<std::int64_t> prompt(ids.begin(), ids.begin() + 16);
    nn::GenerateOptions greedy;
    greedy.temperature = 0.f;
    const double generate = seconds([&] { model->generate(prompt, 32, greedy); });
    std::printf("| generate 32 tokens after 16 (greedy, cached) | %.3f s (%.1f tokens/s) | peak %.0f MiB |\n", generate,
                32 / generate, peak_mib());
    model->train();
    optim::AdamW adam(model->named_parameters());
    IndexArray targets = ids;
    const auto train_step = [&] {
      adam.zero_grad();
      model->loss(ids, targets).backward();
      adam.step();
    };
    const double first = seconds(train_step), second = seconds(train_step);
    std::printf(
        "| training step (AdamW), 1 x 128 tokens: the first (its state allocated), the second | %.3f s, %.3f "
        "s | peak %.0f MiB |\n",
        first, second, peak_mib());
  });
}
