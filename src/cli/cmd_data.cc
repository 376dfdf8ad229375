// `strata data synth-ctr`: writes planted-model click data in the Criteo layout (synth_ctr.h) and
// prints one JSON line (rows, positive rate, oracle AUC), also written to FILE.json. No MPI.
#include <iostream>

#include "cli/commands.h"
#include "cli/synth_ctr.h"

namespace strata::cli {

CLI::App* add_data_command(CLI::App& app, DataFlags& flags, CLI::App** synth_ctr) {
  CLI::App* data = app.add_subcommand("data", "Data tools: generate test and benchmark data sets");
  data->require_subcommand(1);
  *synth_ctr = data->add_subcommand(
      "synth-ctr",
      "Write click data in the Criteo layout (label, I1..I13, C1..C26 as 8 hex digits; TSV, gzip if FILE ends "
      "in .gz) from a planted model with a known oracle AUC; print one JSON line, also written to FILE.json");
  CLI::App* s = *synth_ctr;
  s->add_option("--out", flags.out, "FILE to write; with --files K, K files with -NNNNN-of-KKKKK before the extension (t.tsv.gz: t-00000-of-00002.tsv.gz)")->required();
  s->add_option("--rows", flags.rows, "rows in all, 1..1e8 (default 100000)");
  s->add_option("--seed", flags.seed, "seed: the same seed writes the same bytes everywhere (default 1)");
  s->add_option("--files", flags.files, "split the rows over K files, 1..10000 (default 1)");
  s->add_option("--vocab", flags.vocab, "ids per categorical field: N, or 26 sizes N1,...,N26; 1..1e7 (default 10000)");
  s->add_option("--zipf", flags.zipf, "Zipf exponent of the id frequencies, 0 (uniform)..10 (default 1.05)");
  s->add_option("--missing", flags.missing, "fraction of fields left empty, 0..0.95 (default 0.02)");
  s->add_flag("--header", flags.header, "write the header line label I1..I13 C1..C26 first in every file");
  s->add_option("--days", flags.days,
                "split the rows into D consecutive days, file k holding day k (the per-day distinct and new id "
                "counts go to FILE.json), 1..1000; --files defaults to D");
  s->add_option("--id-bits", flags.id_bits,
                "ids without a vocabulary: each field's ids spread over a 2^B space, written as ceil(B/4) hex "
                "digits, 16..62 (default: 8 hex digits of the popularity rank)");
  s->add_option("--churn", flags.churn,
                "with --id-bits and --days: the fraction of each field's ids replaced by fresh ids from one day to "
                "the next, at every popularity, 0..1 (default 0)");
  return data;
}

int run_data_synth_ctr(const DataFlags& flags) {
  const SynthCtrOptions options = parse_synth_ctr_options(flags);
  const SynthCtrSummary summary = write_synth_ctr(options);
  std::cout << summary.json << "\n" << std::flush;
  return kExitOk;
}

}  // namespace strata::cli
