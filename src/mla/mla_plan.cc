// BuildMlaTasks (mla_plan.h) and rpa::MlaPlan (rpa/mla.h).
#include "mla/mla_plan.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "format.h"
#include "mla/mla_validate.h"
#include "rpa/mla.h"

namespace rpa {
namespace internal {
namespace {

// A task's fixed cost (q load and transpose, output store) in cost units.
constexpr int64_t kTaskOverhead = 4096;
// Split long key ranges until every thread has about this many tasks.
constexpr int64_t kTasksPerThread = 4;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The unsplit tasks: every q tile of every sequence over the keys its rows
// see (causal: up to its last row's position).
int64_t WholeTasks(const MlaProblem& p, MlaTasks& t) {
  t.whole.clear();
  t.whole_costs.clear();
  int64_t total = 0;
  for (int32_t seq = 0; seq < p.num_seqs; ++seq) {
    const int64_t q_len = p.cu_q_lens[seq + 1] - p.cu_q_lens[seq];
    const int64_t kv_len = p.kv_lens[seq];
    for (int64_t qb = 0; qb < q_len; qb += t.q_tile) {
      const int64_t qe = std::min(q_len, qb + t.q_tile);
      const int64_t keys = p.causal ? kv_len - q_len + qe : kv_len;
      MlaTask task;
      task.seq = seq;
      task.q_begin = static_cast<int32_t>(qb);
      task.q_end = static_cast<int32_t>(qe);
      task.kv_end = static_cast<int32_t>(keys);
      const int64_t cost = MlaRoundUp((qe - qb) * p.num_heads, 16) * keys + kTaskOverhead;
      t.whole.push_back(task);
      t.whole_costs.push_back(cost);
      total += cost;
    }
  }
  return total;
}

// Task `task` as is, or cut into chunks of whole KV tiles writing partials.
void AddTask(const MlaProblem& p, const MlaTask& task, int64_t cost, int64_t share, MlaTasks& t) {
  const int64_t rows = (task.q_end - task.q_begin) * p.num_heads;
  const int64_t num_tiles = std::max<int64_t>(CeilDiv(task.kv_end, kMlaTileKeys), 1);
  const int64_t chunks = std::clamp<int64_t>(cost / share, 1, num_tiles);
  const int64_t tiles_per_chunk = CeilDiv(num_tiles, chunks);
  const int64_t used = CeilDiv(num_tiles, tiles_per_chunk);
  if (used == 1) {
    t.tasks.push_back(task);
    t.costs.push_back(cost);
    return;
  }
  t.merges.push_back(MlaMerge{static_cast<int32_t>(t.tasks.size()), static_cast<int32_t>(used)});
  for (int64_t c = 0; c < used; ++c) {
    MlaTask part = task;
    part.kv_begin = static_cast<int32_t>(c * tiles_per_chunk * kMlaTileKeys);
    part.kv_end = static_cast<int32_t>(
        std::min<int64_t>(task.kv_end, (c + 1) * tiles_per_chunk * kMlaTileKeys));
    part.partial_offset = t.partial_floats;
    t.partial_floats += rows * (2 + p.dim_ckv);
    t.tasks.push_back(part);
    t.costs.push_back(MlaRoundUp(rows, 16) * (part.kv_end - part.kv_begin) + kTaskOverhead);
  }
}

}  // namespace

void BuildMlaTasks(const MlaProblem& p, MlaTasks& t) {
  t.q_tile = std::max<int64_t>(1, kMlaMaxRows / p.num_heads);
  t.scratch = MlaScratchShape{MlaRoundUp(t.q_tile * p.num_heads, 16), p.dim_ckv, p.dim_kpe};
  t.kernel = &ChooseMlaKernel(p, UsableCpuFeatures());
  t.tasks.clear();
  t.costs.clear();
  t.merges.clear();
  t.partial_floats = 0;
  const int64_t total = WholeTasks(p, t);
  const int64_t threads = std::max(p.num_threads, 1);
  const int64_t share =
      threads > 1 ? std::max<int64_t>(total / (threads * kTasksPerThread), 1) : total + 1;
  for (size_t i = 0; i < t.whole.size(); ++i) AddTask(p, t.whole[i], t.whole_costs[i], share, t);
  t.order.resize(t.tasks.size());
  std::iota(t.order.begin(), t.order.end(), 0);
  // Equal costs keep their order, so the plan is the same every time (by
  // index rather than std::stable_sort, whose buffer a warm plan would allocate).
  std::sort(t.order.begin(), t.order.end(), [&](int32_t a, int32_t b) {
    return t.costs[a] != t.costs[b] ? t.costs[a] > t.costs[b] : a < b;
  });
  t.num_workers = static_cast<int>(
      std::clamp<int64_t>(static_cast<int64_t>(t.tasks.size()), 1, threads));
}

}  // namespace internal

MlaPlan::MlaPlan() = default;
MlaPlan::~MlaPlan() = default;
MlaPlan::MlaPlan(MlaPlan&&) noexcept = default;
MlaPlan& MlaPlan::operator=(MlaPlan&&) noexcept = default;

void MlaPlan::Plan(const MlaShape& shape, const MlaPageTable& page_table,
                   const MlaOptions& options) {
  internal::MlaProblem problem = internal::ValidateMlaPlan(shape, options);
  if (!spare_) spare_ = std::make_unique<internal::MlaPlanState>();
  internal::CopyMlaPageTable(page_table, problem, spare_->metadata);
  spare_->problem = problem;
  internal::BuildMlaTasks(problem, spare_->tasks);
  std::swap(state_, spare_);
}

void MlaPlan::Run(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv_cache,
                  const TensorView& kpe_cache, const MutableTensorView& out,
                  const MlaRunExtras& extras) const {
  RPA_CHECK(state_ != nullptr, ErrorKind::kMetadata, "This MlaPlan has no plan yet.",
            "Call Plan(shape, page_table, options) with the step's page table before Run.");
  internal::MlaProblem problem = state_->problem;
  internal::BindMlaRun({q_nope, q_pe, ckv_cache, kpe_cache, out}, extras, problem);
  internal::RunMlaTasks(problem, state_->tasks);
}

bool MlaPlan::planned() const { return state_ != nullptr; }

MlaShape MlaPlan::shape() const {
  if (!state_) return {};
  const internal::MlaProblem& p = state_->problem;
  return MlaShape{p.num_heads, p.dim_ckv,   p.dim_kpe,  p.page_size,
                  p.num_pages, p.q_dtype, p.kv_dtype};
}

int64_t MlaPlan::num_tokens() const { return state_ ? state_->problem.num_tokens : 0; }
int64_t MlaPlan::num_seqs() const { return state_ ? state_->problem.num_seqs : 0; }
int MlaPlan::num_threads() const { return state_ ? state_->problem.num_threads : 0; }
bool MlaPlan::causal() const { return state_ && state_->problem.causal; }

std::string MlaPlan::DescribeKernels() const {
  if (!state_) return "none";
  const internal::MlaTasks& t = state_->tasks;
  return internal::StrCat(t.kernel->name, "; ", static_cast<int64_t>(t.tasks.size()),
                          " tasks, ", static_cast<int64_t>(t.merges.size()), " split");
}

}  // namespace rpa
