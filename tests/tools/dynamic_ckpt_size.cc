// Bytes of an incremental dynamic-table save against a full one (issue 22's target: a delta with
// <= 10% of the rows touched writes <= 0.2 of a full save). Not a test: a tool whose numbers
// docs/DYNAMIC.md reports.
//
//   strata_test_dynamic_ckpt_size DIR [ROWS] [DIM] [TOUCHED_FRACTION] [EVICTED_FRACTION] [admission]
//
// Builds one table of ROWS rows of DIM floats (Adagrad), saves it full (step 2), then updates a
// random TOUCHED_FRACTION of its rows, lets EVICTED_FRACTION of the others age out, saves the
// delta (step 3) and prints both files' sizes, their ratio and the write times, then restores the
// chain and checks it against the live table (exit 1 on any difference). The live table is also
// saved full as DIR/live/dynamic-3.h5.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/dynamic_glue.h"
#include "ps/dynamic_table.h"
#include "strata/checkpoint/dynamic.h"

int main(int argc, char** argv) {
  using namespace strata;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [ROWS] [DIM] [TOUCHED_FRACTION] [EVICTED_FRACTION] [admission]\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1];
    const std::int64_t rows = argc > 2 ? std::stoll(argv[2]) : 200000;
    const std::int64_t dim = argc > 3 ? std::stoll(argv[3]) : 16;
    const double touched = argc > 4 ? std::stod(argv[4]) : 0.10;
    const double evicted = argc > 5 ? std::stod(argv[5]) : 0.0;
    const bool admission = argc > 6 && std::string(argv[6]) == "admission";
    ps::DynamicTableConfig c;
    c.dim = dim;
    c.capacity = rows * 2;
    c.init = ps::Initializer::uniform(-0.05, 0.05, 1);
    if (admission) c.admit_after = 2;  // the sketch (4 x 65536 counters): whole in a full file
    ps::DynamicTable table(c);
    std::mt19937_64 gen(3);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(rows));
    for (auto& id : ids) id = static_cast<std::int64_t>(gen() >> 24);
    std::shuffle(ids.begin(), ids.end(), gen);
    // The first EVICTED_FRACTION of the ids are updated at step 1, the rest at step 2; the next
    // TOUCHED_FRACTION after them are updated again at step 3, and then rows stamped 1 age out.
    const auto n_old = static_cast<std::size_t>(evicted * static_cast<double>(rows));
    const auto n_touch = static_cast<std::size_t>(touched * static_cast<double>(rows));
    std::vector<float> out(ids.size() * static_cast<std::size_t>(dim));
    if (admission) table.lookup(ids.data(), ids.size(), out.data());
    table.lookup(ids.data(), ids.size(), out.data());
    const std::vector<float> grads(ids.size() * static_cast<std::size_t>(dim), 0.01f);
    table.apply(ids.data(), n_old, grads.data(), 1);
    table.apply(ids.data() + n_old, ids.size() - n_old, grads.data(), 2);
    auto seconds = [](auto t0) { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    auto t0 = std::chrono::steady_clock::now();
    const checkpoint::DynamicTableState full_state = test::full_state("emb", c, table.export_rows());
    const checkpoint::DynamicSaveResult full = checkpoint::write_dynamic_checkpoint(dir, 2, {full_state});
    const double full_s = seconds(t0);
    table.mark_saved();
    table.apply(ids.data() + n_old, n_touch, grads.data(), 3);
    table.evict_older_than(3, 2);
    t0 = std::chrono::steady_clock::now();
    const ps::DynamicTableDelta d = table.export_delta();
    const std::size_t delta_rows = d.rows.ids.size(), delta_evicted = d.evicted_ids.size();
    // As PS 0 saves it: only the sketch counters changed since the parent, when that is smaller.
    checkpoint::DynamicTableState delta_state =
        test::delta_state("emb", c, d, table.size(), 2, full.content_checksums.at(0));
    checkpoint::sparsify_sketch(delta_state, full_state.sketch);
    const checkpoint::DynamicSaveResult delta = checkpoint::write_dynamic_checkpoint(dir, 3, {delta_state});
    const double delta_s = seconds(t0);
    // The chain restores to the live table.
    const checkpoint::DynamicRestore r = checkpoint::restore_dynamic_table(dir, "emb");
    const ps::DynamicTableSnapshot live = table.export_rows();
    const bool same = r.step == 3 && r.state.ids == live.ids && r.state.values.size() == live.values.size() &&
                      std::memcmp(r.state.values.data(), live.values.data(), live.values.size() * sizeof(float)) == 0 &&
                      r.state.slots.at(0) == live.slots.at(0) && r.state.stamps == live.stamps &&
                      r.state.sketch == live.sketch;
    // The live table saved full beside the chain, for `strata ckpt diff DIR/dynamic-3.h5 DIR/live/dynamic-3.h5`.
    std::filesystem::create_directories(dir + "/live");
    checkpoint::write_dynamic_checkpoint(dir + "/live", 3, {test::full_state("emb", c, table.export_rows())});
    std::printf("rows %lld dim %lld optimizer adagrad admission %s\n", static_cast<long long>(rows),
                static_cast<long long>(dim), admission ? "on" : "off");
    std::printf("full  %s: %llu bytes, %.3f s\n", full.path.c_str(), static_cast<unsigned long long>(full.file_bytes),
                full_s);
    std::printf("delta %s: %llu bytes, %.3f s (%zu rows changed = %.1f%%, %zu ids evicted)\n", delta.path.c_str(),
                static_cast<unsigned long long>(delta.file_bytes), delta_s, delta_rows,
                100.0 * static_cast<double>(delta_rows) / static_cast<double>(rows), delta_evicted);
    std::printf("ratio delta/full %.4f; restore of base + delta equals the live table: %s\n",
                static_cast<double>(delta.file_bytes) / static_cast<double>(full.file_bytes), same ? "yes" : "NO");
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
