#include "ob/profile/collective.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include <torch/torch.h>

#include "ob/torch_compat.h"
#include "ob/watch/stats.h"

namespace ob::profile {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kGroupTimeout = std::chrono::seconds(60);

}  // namespace

Result<std::vector<double>> TimeAllReduce(const std::vector<uint64_t>& bytes, int group_size,
                                          const std::string& device, int warmup, int repeats,
                                          Between between) {
  if (group_size < 1 || repeats < 1) return Status::Config("all-reduce: group size and repeats must be positive");
  torch::Device dev(device);
  if (dev.is_cuda() && group_size > compat::CudaDeviceCount())
    return Status::Unavailable("all-reduce group of " + std::to_string(group_size) + " needs " +
                               std::to_string(group_size) + " GPUs, this node has " +
                               std::to_string(compat::CudaDeviceCount()));
  auto store = compat::MakeHashStore();
  std::vector<double> seconds(bytes.size(), 0.0);  // written by rank 0 only
  std::vector<std::string> errors(group_size);

  auto rank_main = [&](int rank) {
    try {
      torch::Device rank_dev = dev.is_cuda() ? torch::Device(torch::kCUDA, rank) : dev;
      auto pg = compat::MakeProcessGroup(store, rank, group_size, rank_dev, kGroupTimeout);
      for (size_t i = 0; i < bytes.size(); ++i) {
        int64_t n = std::max<int64_t>(1, static_cast<int64_t>(bytes[i] / sizeof(float)));
        std::vector<torch::Tensor> buf{torch::ones({n}, torch::TensorOptions().device(rank_dev))};
        if (between.any() && group_size > 1) {
          auto opts = torch::TensorOptions().device(rank_dev);
          const auto a = torch::randn({between.m, between.k}, opts), w = torch::randn({between.k, between.n}, opts);
          auto compute = [&] {
            (void)a.matmul(w);
            compat::Synchronize(rank_dev);
          };
          for (int k = 0; k < warmup; ++k) {
            compute();
            pg->allreduce(buf)->wait();
          }
          // Alternating passes of the products alone and with the
          // all-reduce, so that a change of the machine's speed during the
          // timing falls on both; the median over the passes of the extra
          // per all-reduce, so that one pass a burst of other work fell on
          // does not move it.
          constexpr int kPasses = 8;
          std::vector<double> extra;
          for (int pass = 0; pass < kPasses; ++pass) {
            pg->barrier()->wait();
            auto t0 = Clock::now();
            for (int k = 0; k < repeats; ++k) compute();
            const double alone = std::chrono::duration<double>(Clock::now() - t0).count();
            pg->barrier()->wait();
            t0 = Clock::now();
            for (int k = 0; k < repeats; ++k) {
              compute();
              pg->allreduce(buf)->wait();
            }
            compat::Synchronize(rank_dev);
            const double with = std::chrono::duration<double>(Clock::now() - t0).count();
            extra.push_back((with - alone) / repeats);
          }
          if (rank == 0) seconds[i] = std::max(0.0, watch::Median(extra));
          continue;
        }
        std::vector<double> samples;
        for (int k = 0; k < warmup + repeats; ++k) {
          pg->barrier()->wait();
          compat::Synchronize(rank_dev);
          auto t0 = Clock::now();
          pg->allreduce(buf)->wait();
          compat::Synchronize(rank_dev);
          if (k >= warmup) samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        if (rank == 0) seconds[i] = watch::Median(samples);
      }
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::vector<std::thread> ranks;
  for (int r = 0; r < group_size; ++r) ranks.emplace_back(rank_main, r);
  for (auto& t : ranks) t.join();
  for (int r = 0; r < group_size; ++r) {
    if (!errors[r].empty()) {
      std::string first = FirstLine(errors[r]);
      return Status::Unavailable("all-reduce group of " + std::to_string(group_size) +
                                 " failed on rank " + std::to_string(r) + ": " + first);
    }
  }
  return seconds;
}

}  // namespace ob::profile
