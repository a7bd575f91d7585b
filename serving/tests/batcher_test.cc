#include "batcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>

#include "fake_backend.h"

namespace serving {
namespace {

using std::chrono::milliseconds;
using testing::FakeBackend;
using testing::MakeInput;

Clock::time_point Far() {
  return Clock::now() + std::chrono::seconds(30);
}

std::unique_ptr<DynamicBatcher> MakeBatcher(FakeBackend* backend,
                                            int64_t max_batch, int64_t delay_us,
                                            bool dynamic = true) {
  BatcherOptions options;
  options.max_batch_size = max_batch;
  options.max_queue_delay_us = delay_us;
  options.dynamic_batching = dynamic;
  auto batcher = DynamicBatcher::Create(options, backend, nullptr);
  EXPECT_TRUE(batcher.ok()) << batcher.status().ToString();
  return std::move(batcher).value();
}

void ExpectDoubled(const Tensor& in, const Tensor& out) {
  ASSERT_EQ(out.shape, in.shape);
  for (int64_t i = 0; i < in.element_count(); ++i) {
    ASSERT_FLOAT_EQ(out.data_as<float>()[i], 2 * in.data_as<float>()[i]);
  }
}

TEST(BatcherTest, MergesUpToMaxBatchWithoutWaitingForTheDelay) {
  FakeBackend backend;
  backend.set_latency(milliseconds(100));
  auto batcher = MakeBatcher(&backend, 4, 500000);
  // Occupy the only worker so the next requests queue up together.
  auto blocker = std::make_shared<InferJob>(
      std::vector<Tensor>{MakeInput(4, 2, 0)}, Far());
  auto blocker_done = blocker->future();
  ASSERT_TRUE(batcher->Enqueue(blocker).ok());
  std::this_thread::sleep_for(milliseconds(20));

  std::vector<std::shared_ptr<InferJob>> jobs;
  std::vector<std::future<Status>> futures;
  for (int i = 0; i < 6; ++i) {
    jobs.push_back(std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(1, 2, 10.0f * i)}, Far()));
    futures.push_back(jobs.back()->future());
    ASSERT_TRUE(batcher->Enqueue(jobs.back()).ok());
  }
  const auto start = Clock::now();
  for (auto& f : futures)
    ASSERT_TRUE(f.get().ok());
  ASSERT_TRUE(blocker_done.get().ok());
  // 4 then 2, and none waited the 500 ms delay: the worker was free and
  // nothing more was arriving.
  EXPECT_EQ(backend.batch_sizes(), (std::vector<int64_t>{4, 4, 2}));
  for (size_t i = 0; i < jobs.size(); ++i) {
    ExpectDoubled(jobs[i]->inputs()[0], jobs[i]->outputs()[0]);
  }
  EXPECT_LT(Clock::now() - start, milliseconds(480));
}

TEST(BatcherTest, ALoneRequestWithAFreeWorkerNeverWaitsForTheDelay) {
  FakeBackend backend;
  auto batcher = MakeBatcher(&backend, 8, 2000000);  // 2 s
  for (int i = 0; i < 5; ++i) {
    auto job = std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(1, 2, 1)}, Far());
    auto done = job->future();
    const auto start = Clock::now();
    ASSERT_TRUE(batcher->Enqueue(job).ok());
    ASSERT_TRUE(done.get().ok());
    EXPECT_LT(Clock::now() - start, milliseconds(500)) << "request " << i;
    ExpectDoubled(job->inputs()[0], job->outputs()[0]);
  }
  EXPECT_EQ(backend.batch_sizes(), (std::vector<int64_t>(5, 1)));
}

TEST(BatcherTest, ABurstFormsBatchesButNoRequestWaitsLongerThanTheDelay) {
  FakeBackend backend;
  backend.set_latency(milliseconds(20));
  auto batcher = MakeBatcher(&backend, 64, 60000);  // 60 ms
  // Requests 2 ms apart, ten times faster than one execution.
  std::vector<std::shared_ptr<InferJob>> jobs;
  std::vector<std::future<Status>> futures;
  for (int i = 0; i < 30; ++i) {
    jobs.push_back(std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(1, 2, static_cast<float>(i))}, Far()));
    futures.push_back(jobs.back()->future());
    ASSERT_TRUE(batcher->Enqueue(jobs.back()).ok());
    std::this_thread::sleep_for(milliseconds(2));
  }
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  const auto sizes = backend.batch_sizes();
  EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), 30);
  EXPECT_LE(sizes.size(), 10u) << "the burst was not batched";
  for (const auto& job : jobs) {
    ExpectDoubled(job->inputs()[0], job->outputs()[0]);
  }
}

TEST(BatcherTest, ClosedLoopClientsGetFullBatchesNotAlternatingHalves) {
  // N clients that each send their next request a moment after their answer
  // (as wrk, a load balancer or a pool of tritonclients do). Dispatching at
  // once gives batches of B and N-B in turn; a free worker that waits for
  // the clients it just answered gets batches of N.
  constexpr int kClients = 8;
  constexpr int kRounds = 12;
  FakeBackend backend;
  backend.set_latency(milliseconds(20));
  auto batcher = MakeBatcher(&backend, kClients, 50000);  // 50 ms
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        auto job = std::make_shared<InferJob>(
            std::vector<Tensor>{MakeInput(1, 2, static_cast<float>(c))}, Far());
        auto done = job->future();
        if (!batcher->Enqueue(job).ok() || !done.get().ok()) ++failures;
        // Clients come back 0-3.5 ms after their answer.
        std::this_thread::sleep_for(std::chrono::microseconds(500 * c));
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
  const auto sizes = backend.batch_sizes();
  ASSERT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}),
            kClients * kRounds);
  // Alternating halves would average 4 (N/2); full batches average 8.
  const double mean =
      static_cast<double>(kClients * kRounds) / static_cast<double>(sizes.size());
  EXPECT_GE(mean, 6.0) << "batches: " << ::testing::PrintToString(sizes);
}

TEST(BatcherTest, RequestsArrivingTogetherRunOnEveryFreeWorker) {
  FakeBackend backend(/*instances=*/2, /*features=*/2);
  backend.set_latency(milliseconds(150));
  auto batcher = MakeBatcher(&backend, 16, 0);
  std::vector<std::shared_ptr<InferJob>> jobs;
  std::vector<std::future<Status>> futures;
  for (int i = 0; i < 2; ++i) {
    jobs.push_back(std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(2, 2, 1)}, Far()));
    futures.push_back(jobs.back()->future());
  }
  const auto start = Clock::now();
  for (auto& job : jobs) ASSERT_TRUE(batcher->Enqueue(job).ok());
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  // Both workers ran one request each, side by side: not one batch of 4
  // while the other worker sat idle, and not one after the other.
  EXPECT_EQ(backend.batch_sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_LT(Clock::now() - start, milliseconds(290));
}

TEST(BatcherTest, AFullQueueRefusesNewRequests) {
  FakeBackend backend;
  backend.set_latency(milliseconds(200));
  BatcherOptions options;
  options.max_batch_size = 1;
  options.max_queue_size = 2;
  auto batcher = DynamicBatcher::Create(options, &backend, nullptr);
  ASSERT_TRUE(batcher.ok());
  std::vector<std::shared_ptr<InferJob>> jobs;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(1, 2, 1)}, Far()));
  }
  ASSERT_TRUE((*batcher)->Enqueue(jobs[0]).ok());  // running
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE((*batcher)->Enqueue(jobs[1]).ok());
  ASSERT_TRUE((*batcher)->Enqueue(jobs[2]).ok());
  const Status full = (*batcher)->Enqueue(jobs[3]);
  EXPECT_EQ(full.code(), StatusCode::kUnavailable);
  EXPECT_NE(full.message().find("--max-queue-size"), std::string::npos);
}

TEST(BatcherTest, ZeroDelayRunsImmediately) {
  FakeBackend backend;
  auto batcher = MakeBatcher(&backend, 8, 0);
  auto job = std::make_shared<InferJob>(std::vector<Tensor>{MakeInput(1, 2, 1)},
                                        Far());
  auto done = job->future();
  const auto start = Clock::now();
  ASSERT_TRUE(batcher->Enqueue(job).ok());
  ASSERT_TRUE(done.get().ok());
  EXPECT_LT(Clock::now() - start, milliseconds(500));
}

TEST(BatcherTest, RoutesResultsBackUnderConcurrency) {
  FakeBackend backend(/*instances=*/2, /*features=*/3);
  backend.set_latency(milliseconds(1));
  auto batcher = MakeBatcher(&backend, 8, 2000);
  constexpr int kThreads = 16;
  constexpr int kRequestsPerThread = 40;
  std::atomic<int> failures{0};
  std::atomic<int64_t> samples{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int r = 0; r < kRequestsPerThread; ++r) {
        const int64_t n = 1 + static_cast<int64_t>(rng() % 3);
        // Unique values per request: a mixed-up result cannot pass.
        const float base = static_cast<float>(t * 100000 + r * 100);
        auto job = std::make_shared<InferJob>(
            std::vector<Tensor>{MakeInput(n, 3, base)}, Far());
        auto done = job->future();
        if (!batcher->Enqueue(job).ok() || !done.get().ok()) {
          ++failures;
          continue;
        }
        samples += n;
        const Tensor& out = job->outputs()[0];
        if (out.shape != Shape{n, 3}) {
          ++failures;
          continue;
        }
        for (int64_t i = 0; i < n * 3; ++i) {
          if (out.data_as<float>()[i] != 2 * (base + i)) {
            ++failures;
            break;
          }
        }
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(failures.load(), 0);
  const auto sizes = backend.batch_sizes();
  EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}),
            samples.load());
  for (int64_t s : sizes)
    EXPECT_LE(s, 8);
  // Concurrent requests were actually merged, on both workers.
  EXPECT_LT(sizes.size(), static_cast<size_t>(kThreads * kRequestsPerThread));
  EXPECT_EQ(backend.max_concurrent(), 2);
}

TEST(BatcherTest, RejectsOversizeRequests) {
  FakeBackend backend;
  auto batcher = MakeBatcher(&backend, 4, 0);
  auto job = std::make_shared<InferJob>(std::vector<Tensor>{MakeInput(5, 2, 0)},
                                        Far());
  Status s = batcher->Enqueue(job);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds the max batch size 4"),
            std::string::npos);
  EXPECT_TRUE(backend.batch_sizes().empty());
}

TEST(BatcherTest, DisabledBatchingRunsEachRequestAlone) {
  FakeBackend backend;
  backend.set_latency(milliseconds(30));
  auto batcher = MakeBatcher(&backend, 8, 100000, /*dynamic=*/false);
  std::vector<std::shared_ptr<InferJob>> jobs;
  std::vector<std::future<Status>> futures;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(2, 2, 10.0f * i)}, Far()));
    futures.push_back(jobs.back()->future());
    ASSERT_TRUE(batcher->Enqueue(jobs.back()).ok());
  }
  for (auto& f : futures)
    ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(backend.batch_sizes(), (std::vector<int64_t>{2, 2, 2, 2}));
  for (auto& job : jobs)
    ExpectDoubled(job->inputs()[0], job->outputs()[0]);
}

TEST(BatcherTest, DoesNotMergeDifferentTrailingShapes) {
  FakeBackend backend;
  backend.set_latency(milliseconds(50));
  auto batcher = MakeBatcher(&backend, 8, 100000);
  auto blocker = std::make_shared<InferJob>(
      std::vector<Tensor>{MakeInput(8, 2, 0)}, Far());
  auto blocker_done = blocker->future();
  ASSERT_TRUE(batcher->Enqueue(blocker).ok());
  std::this_thread::sleep_for(milliseconds(10));
  auto a = std::make_shared<InferJob>(std::vector<Tensor>{MakeInput(1, 2, 0)},
                                      Far());
  auto b = std::make_shared<InferJob>(std::vector<Tensor>{MakeInput(1, 3, 0)},
                                      Far());
  auto fa = a->future();
  auto fb = b->future();
  ASSERT_TRUE(batcher->Enqueue(a).ok());
  ASSERT_TRUE(batcher->Enqueue(b).ok());
  ASSERT_TRUE(fa.get().ok());
  ASSERT_TRUE(fb.get().ok());
  EXPECT_EQ(backend.batch_sizes(), (std::vector<int64_t>{8, 1, 1}));
}

TEST(BatcherTest, BackendErrorsReachEveryRequestOfTheBatch) {
  FakeBackend backend;
  backend.set_fail(true);
  auto batcher = MakeBatcher(&backend, 8, 20000);
  auto a = std::make_shared<InferJob>(std::vector<Tensor>{MakeInput(1, 2, 0)},
                                      Far());
  auto b = std::make_shared<InferJob>(std::vector<Tensor>{MakeInput(1, 2, 0)},
                                      Far());
  auto fa = a->future();
  auto fb = b->future();
  ASSERT_TRUE(batcher->Enqueue(a).ok());
  ASSERT_TRUE(batcher->Enqueue(b).ok());
  EXPECT_EQ(fa.get().code(), StatusCode::kInternal);
  EXPECT_EQ(fb.get().code(), StatusCode::kInternal);
}

TEST(BatcherTest, ExpiredAndCancelledRequestsNeverRun) {
  FakeBackend backend;
  backend.set_latency(milliseconds(100));
  auto batcher = MakeBatcher(&backend, 1, 0);
  auto blocker = std::make_shared<InferJob>(
      std::vector<Tensor>{MakeInput(1, 2, 0)}, Far());
  auto blocker_done = blocker->future();
  ASSERT_TRUE(batcher->Enqueue(blocker).ok());
  std::this_thread::sleep_for(milliseconds(10));
  auto expiring = std::make_shared<InferJob>(
      std::vector<Tensor>{MakeInput(1, 2, 0)}, Clock::now() + milliseconds(20));
  auto cancelled = std::make_shared<InferJob>(
      std::vector<Tensor>{MakeInput(1, 2, 0)}, Far());
  auto f_expiring = expiring->future();
  auto f_cancelled = cancelled->future();
  ASSERT_TRUE(batcher->Enqueue(expiring).ok());
  ASSERT_TRUE(batcher->Enqueue(cancelled).ok());
  cancelled->Cancel();
  EXPECT_EQ(f_expiring.get().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f_cancelled.get().code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(blocker_done.get().ok());
  EXPECT_EQ(backend.batch_sizes().size(), 1u);
}

TEST(BatcherTest, CallerThatGaveUpLeavesNothingDangling) {
  FakeBackend backend;
  backend.set_latency(milliseconds(50));
  auto batcher = MakeBatcher(&backend, 4, 0);
  {
    auto job = std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(1, 2, 0)}, Far());
    auto done = job->future();
    ASSERT_TRUE(batcher->Enqueue(job).ok());
    // The caller times out while the batch runs and drops everything.
    EXPECT_EQ(done.wait_for(milliseconds(5)), std::future_status::timeout);
    job->Cancel();
  }
  batcher->Stop();
  EXPECT_EQ(backend.batch_sizes().size(), 1u);
}

TEST(BatcherTest, StopDrainsQueuedRequestsThenRejects) {
  FakeBackend backend;
  backend.set_latency(milliseconds(20));
  auto batcher = MakeBatcher(&backend, 2, 1000000);  // 1 s delay
  std::vector<std::shared_ptr<InferJob>> jobs;
  std::vector<std::future<Status>> futures;
  for (int i = 0; i < 7; ++i) {
    jobs.push_back(std::make_shared<InferJob>(
        std::vector<Tensor>{MakeInput(1, 2, 10.0f * i)}, Far()));
    futures.push_back(jobs.back()->future());
    ASSERT_TRUE(batcher->Enqueue(jobs.back()).ok());
  }
  const auto start = Clock::now();
  batcher->Stop();  // does not wait the 1 s delay for the last odd request
  EXPECT_LT(Clock::now() - start, milliseconds(900));
  for (auto& f : futures) {
    ASSERT_EQ(f.wait_for(milliseconds(0)), std::future_status::ready);
    EXPECT_TRUE(f.get().ok());
  }
  for (auto& job : jobs)
    ExpectDoubled(job->inputs()[0], job->outputs()[0]);
  auto late = std::make_shared<InferJob>(
      std::vector<Tensor>{MakeInput(1, 2, 0)}, Far());
  EXPECT_EQ(batcher->Enqueue(late).code(), StatusCode::kUnavailable);
  EXPECT_EQ(batcher->queue_depth(), 0u);
}

TEST(BatcherTest, CreateValidatesOptions) {
  FakeBackend backend;
  BatcherOptions options;
  options.max_batch_size = 0;
  EXPECT_FALSE(DynamicBatcher::Create(options, &backend, nullptr).ok());
  options.max_batch_size = 1;
  EXPECT_FALSE(DynamicBatcher::Create(options, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace serving
