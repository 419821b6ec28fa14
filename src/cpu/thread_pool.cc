#include "cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dpa::cpu {
namespace {

int default_thread_count() {
  if (const char* env = std::getenv("DPA_NUM_THREADS")) {
    char* end = nullptr;
    long value = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && value > 0) return int(std::min<long>(value, 1024));
  }
  unsigned hardware = std::thread::hardware_concurrency();
  return hardware == 0 ? 1 : int(hardware);
}

// One parallel_for call. It lives on the caller's stack; the caller unlinks it from the queue
// and waits until no worker is attached before returning, so workers never see a dead job.
struct Job {
  const std::function<void(int64_t)>* body = nullptr;
  int64_t count = 0;
  int max_helpers = 0;           // workers allowed besides the caller
  std::atomic<int64_t> next{0};  // the next unclaimed task index
  int helpers = 0;               // workers attached now (guarded by the pool mutex)
  int64_t finished = 0;          // tasks completed (guarded by the pool mutex)
  std::exception_ptr error;      // the first failure (guarded by the pool mutex)
};

class ThreadPool {
 public:
  explicit ThreadPool(int threads) : size_(std::max(threads, 1)) {
    for (int w = 0; w + 1 < size_.load(); ++w) workers_.emplace_back([this] { worker_loop(); });
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  int size() const { return size_.load(); }

  // Adds workers until the pool has `threads` threads (the caller counts as one).
  void grow(int threads) {
    std::lock_guard<std::mutex> lock(mutex_);
    while (size_.load() < threads) {
      workers_.emplace_back([this] { worker_loop(); });
      size_.fetch_add(1);
    }
  }

  void run(int64_t count, const std::function<void(int64_t)>& body, int threads) {
    Job job;
    job.body = &body;
    job.count = count;
    job.max_helpers = int(std::min<int64_t>(std::min(threads, size_.load()) - 1, count - 1));
    if (job.max_helpers > 0) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        jobs_.push_back(&job);
      }
      work_cv_.notify_all();
    }
    std::exception_ptr error;
    int64_t done = drain(job, error);
    std::unique_lock<std::mutex> lock(mutex_);
    job.finished += done;
    if (error && !job.error) job.error = error;
    if (job.max_helpers > 0) {
      jobs_.erase(std::find(jobs_.begin(), jobs_.end(), &job));
      done_cv_.wait(lock, [&] { return job.finished == job.count && job.helpers == 0; });
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  // Claims and runs tasks until none is left; returns how many this thread ran.
  static int64_t drain(Job& job, std::exception_ptr& error) {
    int64_t done = 0;
    for (int64_t index = job.next.fetch_add(1); index < job.count; index = job.next.fetch_add(1)) {
      try {
        (*job.body)(index);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
      ++done;
    }
    return done;
  }

  // A queued job with unclaimed tasks and room for another helper (mutex held).
  Job* find_job() {
    for (Job* job : jobs_) {
      if (job->helpers < job->max_helpers && job->next.load() < job->count) return job;
    }
    return nullptr;
  }

  void worker_loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      // Keep the job the wait found: `next` advances without the mutex, so a second
      // find_job() can come back empty once other threads claimed the last tasks.
      Job* job = nullptr;
      work_cv_.wait(lock, [&] { return stop_ || (job = find_job()) != nullptr; });
      if (stop_) return;
      ++job->helpers;
      lock.unlock();
      std::exception_ptr error;
      int64_t done = drain(*job, error);
      lock.lock();
      job->finished += done;
      if (error && !job->error) job->error = error;
      --job->helpers;
      if (job->helpers == 0 && job->finished == job->count) done_cv_.notify_all();
    }
  }

  std::atomic<int> size_;  // threads including the caller; grows, never shrinks
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Job*> jobs_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

std::atomic<int> thread_cap{0};  // set_num_threads; 0: the default

ThreadPool& pool() {
  // Constructed on first use and never destroyed: workers must not be joined during static
  // destruction, when other translation units' state may already be gone.
  static ThreadPool* instance = new ThreadPool(default_thread_count());
  return *instance;
}

}  // namespace

int num_threads() {
  static const int default_threads = default_thread_count();
  const int cap = thread_cap.load();
  return std::min(cap > 0 ? cap : default_threads, pool().size());
}

void set_num_threads(int threads) {
  if (threads > pool().size()) pool().grow(std::min(threads, 1024));
  thread_cap.store(std::max(threads, 0));
}

void parallel_for(int64_t count, const std::function<void(int64_t)>& body) {
  if (count <= 0) return;
  int threads = num_threads();
  if (threads <= 1 || count == 1) {
    for (int64_t index = 0; index < count; ++index) body(index);
    return;
  }
  pool().run(count, body, threads);
}

}  // namespace dpa::cpu
