// Checkpoint layer under mpirun: collective parallel-HDF5 save from N ranks with uneven row
// ownership, independent read-back with a different row split, external readers (h5dump, h5py,
// and FORMAT.md's own Python recipes for the file and metadata checksums), checksums, corruption
// of any byte of a file detected (and never restored), metadata edits detected even in a file
// whose file checksum was recomputed, attributes of the wrong shape or type, checkpoint.json
// entries outside the directory, files that are not checkpoints named by path, orphaned .tmp
// files, and the atomic commit. Every rank runs every collective.
#include <hdf5.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "mpi/mpi_test.h"
#include "strata/checkpoint/checkpoint.h"
#include "strata/checkpoint/dynamic.h"
#include "strata/common/error.h"
#include "strata/common/logging.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::TestComm;

// Rows [b, e) of `rows` split into `parts` nearly equal pieces; piece `i`.
std::pair<std::int64_t, std::int64_t> split(std::int64_t rows, int parts, int i) {
  std::int64_t base = rows / parts, extra = rows % parts;
  std::int64_t b = i * base + std::min<std::int64_t>(i, extra);
  return {b, b + base + (i < extra ? 1 : 0)};
}

float value_f32(std::int64_t row, std::int64_t col) { return static_cast<float>(row) * 0.5f + col * 1e-3f - 7.25f; }
double value_f64(std::int64_t row) { return 1.0 / (row + 3.0); }
std::int64_t value_i64(std::int64_t row, std::int64_t col) { return row * 1000003 + col * 7 - (1LL << 40); }

// Shared test directory (rank 0 creates, everybody uses).
std::string make_dir(MPI_Comm comm, const std::string& tag) { return ::strata::testing::shared_test_dir(comm, "strata_ckpt", tag); }

// Collective: removes the test directory once every rank is done with it.
void remove_dir(MPI_Comm comm, const std::string& dir) { ::strata::testing::remove_shared_test_dir(comm, dir); }

bool broadcast_verdict(MPI_Comm comm, bool ok) {
  int v = ok ? 1 : 0;
  MPI_Bcast(&v, 1, MPI_INT, 0, comm);
  return v != 0;
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  return out;
}

// The Python recipes of checkpoint/FORMAT.md section 4, verbatim (between the markers), so the
// document's code is tested against real files.
std::string format_md_recipes() {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/checkpoint/FORMAT.md");
  std::string line, code;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.find("recipe: begin") != std::string::npos) inside = true;
    else if (line.find("recipe: end") != std::string::npos) inside = false;
    else if (inside && line.rfind("```", 0) != 0) code += line + "\n";
  }
  return code;
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
void write_byte(const std::string& path, std::size_t offset, char byte) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(&byte, 1);
}

// What someone who knows the integrity block would do after editing a file: store the new size
// and the new whole-file CRC-32 (FORMAT.md section 3), so only the metadata checksum can object.
void resign(const std::string& path) {
  std::vector<char> bytes = read_file(path);
  const std::uint64_t size = bytes.size();
  for (int i = 0; i < 8; ++i) bytes[16 + i] = static_cast<char>((size >> (8 * i)) & 0xff);
  for (int i = 0; i < 4; ++i) bytes[12 + i] = 0;
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()));
  for (int i = 0; i < 4; ++i) bytes[12 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  write_file(path, bytes);
}

constexpr std::int64_t kEmbRows = 37, kEmbCols = 5;  // partitioned over all ranks
constexpr std::int64_t kDenseRows = 6;               // held entirely by the last rank
constexpr std::int64_t kIdRows = 11, kIdCols = 3;    // i64, held by rank 0 in two pieces

// Saves the three test variables from the ranks of `comm`; returns the committed path.
std::string save_test_model(MPI_Comm comm, const std::string& dir, std::int64_t step,
                            const SaveOptions& options = {}) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  SaveRequest req;
  req.variables = {{"embedding/table", {kEmbRows, kEmbCols}, DType::kF32, {"m", "v"}},
                   {"dense_bias", {kDenseRows}, DType::kF64, {}},
                   {"ids", {kIdRows, kIdCols}, DType::kI64, {}}};
  // Embedding: uneven split (rank r gets split over size ranks, reversed so rank 0 holds the tail).
  auto [eb, ee] = split(kEmbRows, size, size - 1 - rank);
  static std::vector<float> emb, m, v;
  emb.clear(), m.clear(), v.clear();
  for (auto r = eb; r < ee; ++r)
    for (std::int64_t c = 0; c < kEmbCols; ++c) {
      emb.push_back(value_f32(r, c));
      m.push_back(value_f32(r, c) * 2);
      v.push_back(-value_f32(r, c));
    }
  req.shards.push_back({"embedding/table", eb, ee, emb.data(), {{"m", m.data()}, {"v", v.data()}}});
  static std::vector<double> bias;
  bias.clear();
  if (rank == size - 1) {
    for (std::int64_t r = 0; r < kDenseRows; ++r) bias.push_back(value_f64(r));
    req.shards.push_back({"dense_bias", 0, kDenseRows, bias.data(), {}});
  }
  static std::vector<std::int64_t> ids;
  ids.clear();
  if (rank == 0) {
    for (std::int64_t r = 0; r < kIdRows; ++r)
      for (std::int64_t c = 0; c < kIdCols; ++c) ids.push_back(value_i64(r, c));
    // Two pieces, rows [4,11) first, to exercise multi-piece writes and CRC ordering.
    req.shards.push_back({"ids", 4, kIdRows, ids.data() + 4 * kIdCols, {}});
    req.shards.push_back({"ids", 0, 4, ids.data(), {}});
  }
  Attributes attrs;
  attrs.variable_sequence_hash = 0x1234abcd5678ef00ull;
  attrs.optimizer = "adam";
  attrs.training_position_json = R"({"epoch":2,"workers":[{"worker":0,"epoch":2,"offset":640}]})";
  return save(comm, dir, step, req, attrs, options);
}

TEST(Checkpoint, SaveReadBackWithDifferentSplit) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "rw");
  std::string path = save_test_model(comm.get(), dir, 100);
  STRATA_EXPECT_ALL(comm.get(), path == dir + "/ckpt-100.h5");
  STRATA_EXPECT_ALL(comm.get(), fs::exists(path));
  STRATA_EXPECT_ALL(comm.get(), !fs::exists(path + ".tmp"));

  CheckpointReader reader(path);
  STRATA_EXPECT_ALL(comm.get(), reader.global_step() == 100);
  STRATA_EXPECT_ALL(comm.get(), reader.format_version() == 2);
  STRATA_EXPECT_ALL(comm.get(), reader.variable_sequence_hash() == 0x1234abcd5678ef00ull);
  STRATA_EXPECT_ALL(comm.get(), reader.optimizer() == "adam");
  STRATA_EXPECT_ALL(comm.get(), reader.training_position_json().find("\"offset\":640") != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), reader.variables().size() == 3);
  const VariableMeta* emb = reader.find("embedding/table");
  STRATA_EXPECT_ALL(comm.get(), emb && emb->shape == (std::vector<std::int64_t>{kEmbRows, kEmbCols}) &&
                                    emb->dtype == DType::kF32 && emb->slots == (std::vector<std::string>{"m", "v"}));

  // Read back with a different split: forward order over size+1 parts, this rank takes part rank+1
  // (and rank 0 also part 0).
  bool ok = true;
  for (int part : {comm.rank() + 1, comm.rank() == 0 ? 0 : -1}) {
    if (part < 0) continue;
    auto [b, e] = split(kEmbRows, comm.size() + 1, part);
    std::vector<float> got((e - b) * kEmbCols), gm(got.size()), gv(got.size());
    reader.read_rows("embedding/table", b, e, got.data());
    reader.read_slot_rows("embedding/table", "m", b, e, gm.data());
    reader.read_slot_rows("embedding/table", "v", b, e, gv.data());
    for (auto r = b; r < e; ++r)
      for (std::int64_t c = 0; c < kEmbCols; ++c) {
        float want = value_f32(r, c), want_m = want * 2, want_v = -want;
        std::size_t i = static_cast<std::size_t>((r - b) * kEmbCols + c);
        ok = ok && std::memcmp(&got[i], &want, 4) == 0 && std::memcmp(&gm[i], &want_m, 4) == 0 &&
             std::memcmp(&gv[i], &want_v, 4) == 0;
      }
  }
  STRATA_EXPECT_ALL(comm.get(), ok);
  auto [bb, be] = split(kDenseRows, comm.size(), comm.rank());
  std::vector<double> bias(be - bb);
  reader.read_rows("dense_bias", bb, be, bias.data());
  for (auto r = bb; r < be; ++r) ok = ok && bias[r - bb] == value_f64(r);
  std::vector<std::int64_t> ids(kIdRows * kIdCols);
  reader.read_rows("ids", 0, kIdRows, ids.data());
  for (std::int64_t r = 0; r < kIdRows; ++r)
    for (std::int64_t c = 0; c < kIdCols; ++c) ok = ok && ids[r * kIdCols + c] == value_i64(r, c);
  STRATA_EXPECT_ALL(comm.get(), ok);
  STRATA_EXPECT_ALL(comm.get(), reader.verify().empty());

  bool threw = false;
  try {
    reader.check_compatible("embedding/table", {kEmbRows, kEmbCols + 1}, DType::kF32);
  } catch (const ConfigError& e) {
    threw = std::string(e.what()).find("embedding/table") != std::string::npos;
  }
  STRATA_EXPECT_ALL(comm.get(), threw);
  remove_dir(comm.get(), dir);
}

TEST(Checkpoint, ExternalToolsAndPointer) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "tools");
  std::string path = save_test_model(comm.get(), dir, 7);
  save_test_model(comm.get(), dir, 9);
  bool h5dump_ok = false, pointer_ok = false, h5py_ok = false, no_tmp = false;
  if (comm.rank() == 0) {
    std::string out = run_capture("h5dump -H " + path + " 2>&1");
    h5dump_ok = out.find("GROUP \"variables\"") != std::string::npos &&
                out.find("GROUP \"embedding\"") != std::string::npos &&
                out.find("DATASET \"table\"") != std::string::npos &&
                out.find("( " + std::to_string(kEmbRows) + ", " + std::to_string(kEmbCols) + " )") !=
                    std::string::npos &&
                out.find("( " + std::to_string(kDenseRows) + " )") != std::string::npos;
    if (!h5dump_ok) std::fprintf(stderr, "h5dump output:\n%s\n", out.c_str());
    auto entries = list_checkpoints(dir);
    std::ifstream in(dir + "/checkpoint.json");
    std::stringstream text;
    text << in.rdbuf();
    pointer_ok = entries.size() == 2 && entries[0].file == "ckpt-7.h5" && entries[1].file == "ckpt-9.h5" &&
                 entries[1].global_step == 9 && text.str().find("\"latest\": \"ckpt-9.h5\"") != std::string::npos;
    no_tmp = true;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".tmp") no_tmp = false;
    // Debian's interpreter: python3-h5py installs there, while `python3` on PATH may be another one.
    const std::string py = std::ifstream("/usr/bin/python3").good() ? "/usr/bin/python3" : "python3";
    if (std::system((py + " -c 'import h5py' >/dev/null 2>&1").c_str()) != 0) {
      h5py_ok = true;  // not installed: nothing to compare
      std::fprintf(stderr, "h5py not available; skipping the h5py comparison\n");
    } else {
      std::string script =
          "import h5py, zlib, numpy as np\n"
          "f = h5py.File('" + path + "', 'r')\n"
          "t = f['variables/embedding/table'][()]\n"
          "r = np.arange(t.shape[0], dtype=np.float32)[:, None]; c = np.arange(t.shape[1], dtype=np.float32)[None, :]\n"
          "want = r * np.float32(0.5) + c * np.float32(1e-3) - np.float32(7.25)\n"
          "assert t.dtype == np.float32 and t.shape == (37, 5), t.shape\n"
          "assert np.array_equal(f['slots/embedding/table/m'][()], want * np.float32(2))\n"
          "assert np.array_equal(f['variables/dense_bias'][()], 1.0 / (np.arange(6) + 3.0))\n"
          "assert int(f.attrs['global_step']) == 7 and int(f.attrs['format_version']) == 2\n"
          "for name in ['variables/embedding/table', 'variables/dense_bias', 'variables/ids', 'slots/embedding/table/v']:\n"
          "    d = f[name]\n"
          "    assert zlib.crc32(d[()].astype(d.dtype.newbyteorder('<')).tobytes()) == int(d.attrs['checksum']), name\n"
          + format_md_recipes() +
          "assert file_checksum_ok('" + path + "')\n"
          "assert zlib.crc32(manifest(f)) == int(f.attrs['metadata_checksum'])\n"
          "print('H5PY_OK', float(abs(t - want).max()))\n";
      std::string script_path = dir + "/check.py";
      std::ofstream(script_path) << script;
      std::string out2 = run_capture(py + " " + script_path + " 2>&1");
      h5py_ok = out2.find("H5PY_OK 0.0") != std::string::npos;
      if (!h5py_ok) std::fprintf(stderr, "h5py output:\n%s\n", out2.c_str());
    }
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), h5dump_ok));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), pointer_ok));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), no_tmp));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), h5py_ok));
  remove_dir(comm.get(), dir);
}

TEST(Checkpoint, CorruptionIsDetectedAndLatestFallsBack) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "corrupt");
  save_test_model(comm.get(), dir, 1);
  std::string latest = save_test_model(comm.get(), dir, 2);
  bool detected = false, fell_back = false, copy_detected = false;
  if (comm.rank() == 0) {
    // Corrupt a copy first (the original stays valid), then the latest file in place.
    std::string copy = dir + "/copy.h5";
    fs::copy_file(latest, copy);
    haddr_t offset = HADDR_UNDEF;
    {
      hid_t f = H5Fopen(latest.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      hid_t d = H5Dopen2(f, "/variables/embedding/table", H5P_DEFAULT);
      offset = H5Dget_offset(d);
      H5Dclose(d);
      H5Fclose(f);
    }
    auto flip = [&](const std::string& file) {
      std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(static_cast<std::streamoff>(offset) + 13);
      char byte = 0;
      io.read(&byte, 1);
      byte = static_cast<char>(byte ^ 0x5a);
      io.seekp(static_cast<std::streamoff>(offset) + 13);
      io.write(&byte, 1);
    };
    if (offset != HADDR_UNDEF) {
      flip(copy);
      // The file checksum fails first, and the table of the integrity block names the dataset.
      auto bad = CheckpointReader(copy).verify();
      copy_detected = bad.size() == 2 && bad[0].path == "(file)" &&
                      bad[0].reason.find("file checksum mismatch") != std::string::npos &&
                      bad[0].reason.find("the data of variables/embedding/table changed") != std::string::npos &&
                      bad[1].path == "variables/embedding/table";
      if (!copy_detected)
        for (const auto& b : bad) std::fprintf(stderr, "verify: %s: %s\n", b.path.c_str(), b.reason.c_str());
      flip(latest);
      auto bad2 = CheckpointReader(latest).verify();
      detected = bad2.size() == 2;
      auto chosen = latest_checkpoint(dir);
      fell_back = chosen && chosen->global_step == 1 && chosen->skipped.size() == 1;
    }
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), copy_detected));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), detected));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), fell_back));
  remove_dir(comm.get(), dir);
}

// Every single-byte change anywhere in a file (integrity block, superblock, object headers,
// attributes, B-trees, heaps, data, free space) fails verify_checkpoint() without HDF5 parsing the
// damaged file, and latest_checkpoint() (the restore decision) then falls back to the previous
// file. Exhaustive over the file's bytes, on rank 0.
TEST(Checkpoint, EveryByteIsCovered) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "flip");
  save_test_model(comm.get(), dir, 4);
  std::string path = save_test_model(comm.get(), dir, 5);
  std::size_t size = 0, undetected = 0, restored = 0, fallback_checks = 0;
  bool clean_before = false, clean_after = false;
  if (comm.rank() == 0) {
    const std::vector<char> original = read_file(path);
    size = original.size();
    clean_before = verify_checkpoint(path).ok;
    const LogLevel level = log_level();
    set_log_level(LogLevel::kError);  // latest_checkpoint() warns about every skipped file
    std::uint32_t x = 12345;  // deterministic xorshift: a different non-zero change per byte
    for (std::size_t i = 0; i < size; ++i) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      const char changed = static_cast<char>(original[i] ^ static_cast<char>(1 + x % 255));
      write_byte(path, i, changed);
      const Verification v = verify_checkpoint(path);
      if (v.ok || v.error.empty()) {
        ++undetected;
        std::fprintf(stderr, "byte %zu: verify ok=%d error='%s'\n", i, v.ok, v.error.c_str());
      }
      // The restore decision, for every 61st byte and every byte of the first 1 KiB.
      if (i < 1024 || i % 61 == 0) {
        ++fallback_checks;
        auto chosen = latest_checkpoint(dir);
        if (!chosen || chosen->global_step != 4 || chosen->skipped.size() != 1) ++restored;
      }
      write_byte(path, i, original[i]);
    }
    set_log_level(level);
    clean_after = verify_checkpoint(path).ok && read_file(path) == original;
    std::fprintf(stderr, "%zu bytes changed one at a time: %zu undetected; %zu restore decisions, %zu wrong\n", size,
                 undetected, fallback_checks, restored);
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), clean_before && clean_after));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), size > 4096 && undetected == 0));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), restored == 0));
  remove_dir(comm.get(), dir);
}

// Attribute edits in a file whose size and whole-file CRC were then recomputed: the metadata
// checksum still refuses it, on open and in verify.
TEST(Checkpoint, MetadataChecksumCatchesResignedEdits) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "resign");
  std::string path = save_test_model(comm.get(), dir, 8);
  bool position_caught = false, step_caught = false, resign_alone_ok = false;
  if (comm.rank() == 0) {
    auto edit = [&](const std::string& copy, const char* object, const char* attr, bool string_value) {
      fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
      hid_t f = H5Fopen(copy.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      hid_t o = H5Oopen(f, object, H5P_DEFAULT);
      hid_t a = H5Aopen(o, attr, H5P_DEFAULT);
      if (string_value) {
        hid_t t = H5Aget_type(a);
        const char* text = R"({"epoch":2,"workers":[{"worker":0,"epoch":2,"offset":999}]})";
        H5Awrite(a, t, &text);
        H5Tclose(t);
      } else {
        std::int64_t v = 4242;
        H5Awrite(a, H5T_NATIVE_INT64, &v);
      }
      H5Aclose(a);
      H5Oclose(o);
      H5Fclose(f);
      resign(copy);
    };
    auto caught = [&](const std::string& copy) {
      const Verification v = verify_checkpoint(copy);
      bool threw = false;
      try {
        CheckpointReader r(copy);
      } catch (const Error& e) {
        threw = std::string(e.what()).find("metadata checksum mismatch") != std::string::npos &&
                std::string(e.what()).find(copy) != std::string::npos;
      }
      if (!threw || v.ok || v.error.find("metadata checksum mismatch") == std::string::npos)
        std::fprintf(stderr, "%s: verify ok=%d error='%s', open threw=%d\n", copy.c_str(), v.ok, v.error.c_str(), threw);
      return threw && !v.ok && v.error.find("metadata checksum mismatch") != std::string::npos;
    };
    edit(dir + "/position.h5", "/", "training_position", true);
    position_caught = caught(dir + "/position.h5");
    // optimizer_step is written only when non-zero; the test model has none, so edit global_step.
    edit(dir + "/step.h5", "/", "global_step", false);
    step_caught = caught(dir + "/step.h5");
    // Re-signing an unedited copy changes nothing: the recipe itself is right.
    fs::copy_file(path, dir + "/same.h5", fs::copy_options::overwrite_existing);
    resign(dir + "/same.h5");
    resign_alone_ok = verify_checkpoint(dir + "/same.h5").ok && read_file(dir + "/same.h5") == read_file(path);
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), position_caught));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), step_caught));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), resign_alone_ok));
  remove_dir(comm.get(), dir);
}

// Files that are no checkpoint, or cut short: errors name the path; verify says why.
TEST(Checkpoint, NonCheckpointFilesAreNamed) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "notckpt");
  std::string path = save_test_model(comm.get(), dir, 9);
  bool ok = true;
  if (comm.rank() == 0) {
    std::ofstream(dir + "/text.h5") << "hello, not HDF5\n";
    std::ofstream(dir + "/empty.h5");
    std::vector<char> bytes = read_file(path);
    bytes.resize(bytes.size() / 2);
    write_file(dir + "/half.h5", bytes);
    const std::pair<const char*, const char*> cases[] = {
        {"/text.h5", "neither a strata integrity block nor an HDF5 signature"},
        {"/empty.h5", "the file is empty"},
        {"/half.h5", "truncated after it was written"}};
    for (const auto& [name, why] : cases) {
      const std::string file = dir + name;
      std::string message;
      try {
        CheckpointReader r(file);
      } catch (const Error& e) {
        message = e.what();
      }
      const Verification v = verify_checkpoint(file);
      const bool good = message.find(file) != std::string::npos && message.find(why) != std::string::npos &&
                        !v.ok && v.error.find(why) != std::string::npos;
      if (!good) std::fprintf(stderr, "%s: open: '%s'; verify: '%s'\n", name, message.c_str(), v.error.c_str());
      ok = ok && good;
    }
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), ok));
  remove_dir(comm.get(), dir);
}

TEST(Checkpoint, OrphanedFilesAreRemoved) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "orphans");
  save_test_model(comm.get(), dir, 3);
  bool ok = false;
  if (comm.rank() == 0) {
    for (const char* name : {"ckpt-7.h5.tmp", "checkpoint.json.tmp", "notes.tmp", "ckpt-x.txt", "ckpt-x.h5.tmp"})
      std::ofstream(dir + "/" + name) << "partial";
    auto swept = remove_orphaned_files(dir);
    ok = swept.removed == std::vector<std::string>{"checkpoint.json.tmp", "ckpt-7.h5.tmp"} && swept.kept.empty() &&
         fs::exists(dir + "/notes.tmp") && fs::exists(dir + "/ckpt-x.txt") && fs::exists(dir + "/ckpt-x.h5.tmp") &&
         fs::exists(dir + "/ckpt-3.h5") && fs::exists(dir + "/checkpoint.json") &&
         remove_orphaned_files(dir).removed.empty() && remove_orphaned_files(dir + "/nope").removed.empty() &&
         !fs::exists(dir + "/nope");
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), ok));
  remove_dir(comm.get(), dir);
}

// What a PS killed between the file's rename and checkpoint.json's update leaves (a complete
// ckpt-<step>.h5 that no entry names) is listed as uncommitted and removed, beside a .tmp; what is
// committed, named by a refused entry, not named like a checkpoint, or a link named like one (and
// the file the link points to) survives.
TEST(Checkpoint, UncommittedCompleteFileIsListedAndRemoved) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "uncommitted");
  std::string other = make_dir(comm.get(), "uncommitted_other");
  save_test_model(comm.get(), dir, 3);
  save_test_model(comm.get(), other, 9);
  bool ok = false;
  if (comm.rank() == 0) {
    std::string why;
    auto expect = [&](bool cond, const std::string& what) {
      if (!cond) why += what + "; ";
    };
    // A complete, valid file of a later step that checkpoint.json does not name.
    fs::copy_file(other + "/ckpt-9.h5", dir + "/ckpt-9.h5");
    std::ofstream(dir + "/ckpt-11.h5.tmp") << "partial";
    std::ofstream(dir + "/ckpt-012.h5") << "not a name save() writes";
    std::ofstream(dir + "/model-13.h5") << "a user's file";
    std::ofstream(other + "/target.bin") << "outside the directory";
    fs::create_symlink(other + "/target.bin", dir + "/ckpt-14.h5");
    fs::create_symlink(other + "/ckpt-9.h5", dir + "/ckpt-15.h5.tmp");
    fs::create_directory(dir + "/ckpt-16.h5");

    const auto listed = list_uncommitted_files(dir);
    expect(listed.size() == 2, "two uncommitted files listed, got " + std::to_string(listed.size()));
    if (listed.size() == 2) {
      expect(listed[0].file == "ckpt-11.h5.tmp" && !listed[0].complete && listed[0].bytes == 7, "the .tmp listed");
      expect(listed[1].file == "ckpt-9.h5" && listed[1].complete &&
                 listed[1].bytes == fs::file_size(dir + "/ckpt-9.h5"),
             "the complete file listed");
    }
    const auto latest = latest_checkpoint(dir);
    expect(latest && latest->global_step == 3 && latest->skipped.empty(), "latest is the committed step 3");

    const auto swept = remove_orphaned_files(dir);
    expect(swept.removed == std::vector<std::string>{"ckpt-11.h5.tmp", "ckpt-9.h5"} && swept.kept.empty(),
           "removed exactly the .tmp and the complete file");
    expect(!fs::exists(dir + "/ckpt-9.h5") && !fs::exists(dir + "/ckpt-11.h5.tmp"), "both gone");
    expect(fs::exists(dir + "/ckpt-3.h5") && fs::exists(dir + "/checkpoint.json") && verify_entry(dir, list_checkpoints(dir).at(0)).ok,
           "the committed file and the pointer intact");
    expect(fs::exists(dir + "/ckpt-012.h5") && fs::exists(dir + "/model-13.h5") && fs::is_directory(dir + "/ckpt-16.h5"),
           "other names survive");
    expect(fs::is_symlink(dir + "/ckpt-14.h5") && fs::is_symlink(dir + "/ckpt-15.h5.tmp") &&
               fs::exists(other + "/target.bin") && fs::exists(other + "/ckpt-9.h5"),
           "links and their targets survive");
    expect(list_uncommitted_files(dir).empty(), "nothing uncommitted left");
    if (!why.empty()) std::fprintf(stderr, "UncommittedCompleteFileIsListedAndRemoved: %s\n", why.c_str());
    ok = why.empty();
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), ok));
  remove_dir(comm.get(), dir);
  remove_dir(comm.get(), other);
}

// A file named by a refused entry of checkpoint.json is never removed, and without a readable
// checkpoint.json a complete file is kept (it may be a user's); .tmp files go either way.
TEST(Checkpoint, OrphanSweepKeepsWhatThePointerCannotVouchFor) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "sweep_pointer");
  save_test_model(comm.get(), dir, 3);
  bool ok = false;
  if (comm.rank() == 0) {
    std::string why;
    auto expect = [&](bool cond, const std::string& what) {
      if (!cond) why += what + "; ";
    };
    const std::string committed = dir + "/ckpt-3.h5";
    // checkpoint.json names ckpt-7.h5 with a step it does not match: refused, and never deleted.
    fs::copy_file(committed, dir + "/ckpt-7.h5");
    std::ofstream(dir + "/checkpoint.json")
        << R"({"format_version": 2, "latest": "ckpt-3.h5", "checkpoints": [)"
        << R"({"file": "ckpt-7.h5", "global_step": 8, "created_unix": 1},)"
        << R"({"file": "ckpt-3.h5", "global_step": 3, "created_unix": 2}]})";
    auto swept = remove_orphaned_files(dir);
    expect(swept.removed.empty() && swept.kept.empty() && fs::exists(dir + "/ckpt-7.h5"), "refused entry's file kept");

    // No checkpoint.json: the complete file stays, the .tmp goes.
    fs::rename(dir + "/checkpoint.json", dir + "/saved.json");
    std::ofstream(dir + "/ckpt-5.h5.tmp") << "partial";
    swept = remove_orphaned_files(dir);
    expect(swept.removed == std::vector<std::string>{"ckpt-5.h5.tmp"}, "the .tmp removed without a pointer");
    expect(swept.kept == std::vector<std::string>{"ckpt-3.h5", "ckpt-7.h5"} &&
               swept.why_kept.find("no checkpoint.json") != std::string::npos,
           "complete files kept without a pointer: " + swept.why_kept);
    // A malformed checkpoint.json: the same.
    std::ofstream(dir + "/checkpoint.json") << "{ not json";
    swept = remove_orphaned_files(dir);
    expect(swept.removed.empty() && swept.kept.size() == 2 &&
               swept.why_kept.find("cannot be read") != std::string::npos,
           "complete files kept with a malformed pointer: " + swept.why_kept);
    expect(fs::exists(dir + "/ckpt-3.h5") && fs::exists(dir + "/ckpt-7.h5"), "both complete files survive");

    // The file this job restores from is kept even when uncommitted here.
    fs::remove(dir + "/checkpoint.json");
    fs::rename(dir + "/saved.json", dir + "/checkpoint.json");  // names only ckpt-3.h5 (and the refused ckpt-7.h5)
    fs::copy_file(committed, dir + "/ckpt-21.h5");
    fs::copy_file(committed, dir + "/ckpt-22.h5");
    swept = remove_orphaned_files(dir, dir + "/./ckpt-21.h5");
    expect(swept.removed == std::vector<std::string>{"ckpt-22.h5"} && swept.kept == std::vector<std::string>{"ckpt-21.h5"} &&
               swept.why_kept.find("restores from") != std::string::npos,
           "the restore's file kept: " + swept.why_kept);
    if (!why.empty()) std::fprintf(stderr, "OrphanSweepKeepsWhatThePointerCannotVouchFor: %s\n", why.c_str());
    ok = why.empty();
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), ok));
  remove_dir(comm.get(), dir);
}

// While another job holds the directory (its DirectoryClaim), nothing is removed, not even a
// .tmp: that job may be writing or committing it. Once the claim is released, the sweep runs.
TEST(Checkpoint, OrphanSweepLeavesAClaimedDirectoryAlone) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "sweep_claimed");
  save_test_model(comm.get(), dir, 3);
  bool ok = false;
  if (comm.rank() == 0) {
    std::string why;
    auto expect = [&](bool cond, const std::string& what) {
      if (!cond) why += what + "; ";
    };
    const std::string committed = dir + "/ckpt-3.h5";
    fs::copy_file(committed, dir + "/ckpt-4.h5");
    std::ofstream(dir + "/ckpt-5.h5.tmp") << "being written";
    {
      // flock(2) locks belong to the open file description, so a claim taken here conflicts with
      // the sweep's exclusive lock just as another process's would.
      DirectoryClaim other_job(dir, 5.0);
      expect(other_job.held(), "claim taken: " + other_job.why_not());
      DirectoryClaim second_job(dir, 5.0);
      expect(second_job.held(), "claims are shared: " + second_job.why_not());
      const auto swept = remove_orphaned_files(dir);
      expect(swept.removed.empty() && swept.kept == std::vector<std::string>{"ckpt-4.h5", "ckpt-5.h5.tmp"} &&
                 swept.why_kept.find("another job holds the directory") != std::string::npos,
             "nothing removed while claimed: " + swept.why_kept);
      expect(fs::exists(dir + "/ckpt-4.h5") && fs::exists(dir + "/ckpt-5.h5.tmp"), "both still there");
    }
    const auto swept = remove_orphaned_files(dir);
    expect(swept.removed == std::vector<std::string>{"ckpt-4.h5", "ckpt-5.h5.tmp"}, "removed once released");
    expect(fs::is_regular_file(dir + "/" + kLockFile) && fs::exists(committed), "lock file and committed file remain");
    // A lock file that is a link is refused, never followed: nothing removed, and no claim.
    fs::remove(dir + "/" + kLockFile);
    fs::create_symlink("/dev/null", dir + "/" + kLockFile);
    std::ofstream(dir + "/ckpt-6.h5.tmp") << "partial";
    const auto refused = remove_orphaned_files(dir);
    expect(refused.removed.empty() && refused.kept == std::vector<std::string>{"ckpt-6.h5.tmp"} &&
               refused.why_kept.find("symbolic link") != std::string::npos,
           "linked lock file: nothing removed: " + refused.why_kept);
    DirectoryClaim no_claim(dir, 1.0);
    expect(!no_claim.held() && no_claim.why_not().find("symbolic link") != std::string::npos,
           "no claim through a link: " + no_claim.why_not());
    if (!why.empty()) std::fprintf(stderr, "OrphanSweepLeavesAClaimedDirectoryAlone: %s\n", why.c_str());
    ok = why.empty();
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), ok));
  remove_dir(comm.get(), dir);
}

// A variable with zero rows has no data in the file (no offset): it still round-trips, verifies
// and is listed in the integrity block.
TEST(Checkpoint, EmptyVariableVerifies) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "empty");
  SaveRequest req;
  req.variables = {{"empty/table", {0, 3}, DType::kF32, {"m"}}, {"w", {4}, DType::kF64, {}}};
  std::vector<double> w{1.5, -2.0, 0.25, 8.0};
  if (comm.rank() == 0) req.shards.push_back({"w", 0, 4, w.data(), {}});
  std::string path = save(comm.get(), dir, 12, req, {});
  bool ok = false;
  if (comm.rank() == 0) {
    const Verification v = verify_checkpoint(path);
    CheckpointReader r(path);
    std::vector<double> got(4);
    r.read_rows("w", 0, 4, got.data());
    ok = v.ok && v.datasets == 3 && r.variables().size() == 2 && r.find("empty/table")->shape[0] == 0 &&
         r.find("empty/table")->slots == std::vector<std::string>{"m"} && got == w;
    if (!ok) std::fprintf(stderr, "verify: ok=%d datasets=%zu error='%s'\n", v.ok, v.datasets, v.error.c_str());
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), ok));
  remove_dir(comm.get(), dir);
}

// Attributes of the wrong shape or type, in a file whose size and whole-file CRC were then
// recomputed: open and verify name the attribute instead of writing past a one-element buffer.
TEST(Checkpoint, MalformedAttributesAreRefused) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "attrs");
  std::string path = save_test_model(comm.get(), dir, 5);
  bool ok = true;
  if (comm.rank() == 0) {
    auto replace = [&](const std::string& copy, const char* object, const char* attr, hid_t type,
                       std::vector<hsize_t> dims, const void* data) {
      fs::copy_file(path, copy, fs::copy_options::overwrite_existing);
      hid_t f = H5Fopen(copy.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
      hid_t o = H5Oopen(f, object, H5P_DEFAULT);
      H5Adelete(o, attr);
      hid_t space = dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
      hid_t a = H5Acreate2(o, attr, type, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, type, data);
      H5Aclose(a);
      H5Sclose(space);
      H5Oclose(o);
      H5Fclose(f);
      resign(copy);
    };
    std::vector<std::int64_t> many(4096, 2);
    std::vector<const char*> names(64, "adam");
    hid_t vl = H5Tcopy(H5T_C_S1);
    H5Tset_size(vl, H5T_VARIABLE);
    const double half = 0.5;
    struct Case {
      std::string file, expected;
    };
    std::vector<Case> cases;
    replace(dir + "/version.h5", "/", "format_version", H5T_NATIVE_INT64, {4096}, many.data());
    cases.push_back({dir + "/version.h5", "root attribute 'format_version' must be a scalar integer, found an array of shape [4096]"});
    replace(dir + "/optimizer.h5", "/", "optimizer", vl, {64}, names.data());
    cases.push_back({dir + "/optimizer.h5", "root attribute 'optimizer' must be a scalar string, found an array of shape [64]"});
    replace(dir + "/created.h5", "/", "created_unix", H5T_NATIVE_DOUBLE, {}, &half);
    cases.push_back({dir + "/created.h5", "root attribute 'created_unix' must be a scalar integer, found a float"});
    replace(dir + "/checksum.h5", "/variables/ids", "checksum", H5T_NATIVE_INT64, {3}, many.data());
    cases.push_back({dir + "/checksum.h5", "attribute 'checksum' of variables/ids must be a scalar integer, found an array of shape [3]"});
    H5Tclose(vl);
    for (const auto& c : cases) {
      const Verification v = verify_checkpoint(c.file);
      std::string opened;
      try {
        CheckpointReader r(c.file);
      } catch (const Error& e) {
        opened = e.what();
      }
      const bool good = !v.ok && v.error == c.expected && opened.find(c.file) != std::string::npos &&
                        opened.find(c.expected) != std::string::npos;
      if (!good) std::fprintf(stderr, "%s: verify '%s', open '%s'\n", c.file.c_str(), v.error.c_str(), opened.c_str());
      ok = ok && good;
    }
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), ok));
  remove_dir(comm.get(), dir);
}

// checkpoint.json entries that are no ckpt-<step>.h5 of the directory are refused and never
// deleted by max_to_keep; a symlink entry fails verify_entry without being followed.
TEST(Checkpoint, PointerEntriesStayInsideTheDirectory) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "entries");
  const std::string victim = dir + "_victim.txt";
  save_test_model(comm.get(), dir, 10);
  if (comm.rank() == 0) {
    std::ofstream(victim) << "precious";
    fs::create_symlink(dir + "/ckpt-10.h5", dir + "/ckpt-11.h5");
    std::ofstream(dir + "/checkpoint.json")
        << R"({"checkpoints": [{"file": "../)" << fs::path(victim).filename().string()
        << R"(", "global_step": 1, "created_unix": 1}, {"file": "/etc/hostname", "global_step": 2, "created_unix": 2},)"
        << R"( {"file": "ckpt-10.h5", "global_step": 10, "created_unix": 3}, {"file": "ckpt-11.h5", "global_step": 11, "created_unix": 4}]})";
  }
  MPI_Barrier(comm.get());
  bool listed = false, link_refused = false;
  if (comm.rank() == 0) {
    const CheckpointList list = read_checkpoint_list(dir);
    listed = list.entries.size() == 2 && list.refused.size() == 2 && list.refused[1].file == "/etc/hostname";
    const Verification v = verify_entry(dir, list.entries[1]);
    link_refused = !v.ok && v.error == "is a symbolic link, not a regular file";
    if (!listed || !link_refused) std::fprintf(stderr, "entries %zu refused %zu; link: '%s'\n", list.entries.size(), list.refused.size(), v.error.c_str());
  }
  set_log_level(LogLevel::kError);  // the save warns about each refused entry and the kept link
  SaveOptions keep_one;
  keep_one.max_to_keep = 1;
  save_test_model(comm.get(), dir, 12, keep_one);
  set_log_level(LogLevel::kWarn);
  bool kept = false;
  if (comm.rank() == 0) {
    kept = fs::exists(victim) && fs::is_symlink(dir + "/ckpt-11.h5") && !fs::exists(dir + "/ckpt-10.h5") &&
           list_checkpoints(dir).size() == 1 && read_checkpoint_list(dir).refused.empty();
    fs::remove(victim);
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), listed && link_refused));
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), kept));
  remove_dir(comm.get(), dir);
}

// A table state for the dynamic files beside the dense ones: rows of 2 floats, ids that grow with
// the step (a delta carries the rows added since its parent).
DynamicTableState table_at(std::int64_t step, bool full, std::int64_t parent, std::uint32_t parent_crc) {
  DynamicTableState t;
  t.name = "emb";
  t.kind = full ? DynamicKind::kFull : DynamicKind::kDelta;
  t.dim = 2;
  t.optimizer = "sgd";
  for (std::int64_t id = full ? 0 : parent; id < step; ++id) {
    t.ids.push_back(id * 7 + 1);
    t.values.insert(t.values.end(), {static_cast<float>(id), static_cast<float>(step)});
    t.stamps.push_back(step);
  }
  t.clock = step;
  t.total_rows = step;
  if (!full) {
    t.parent_step = parent;
    t.parent_checksum = parent_crc;
  }
  return t;
}

// max_to_keep covers the dynamic-<step>.h5 files: after each save the directory holds exactly the
// files the kept steps' chains need (a full base every 3 saves, deltas between, as a job with
// --dynamic-full-every 3 writes them, each before its dense save commits).
TEST(Checkpoint, MaxToKeepDeletesTheDynamicFilesNoKeptStepNeeds) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "dynkeep");
  SaveOptions keep_two;
  keep_two.max_to_keep = 2;
  std::uint32_t crc = 0;
  bool all_ok = true;
  for (std::int64_t step = 1; step <= 8; ++step) {
    const bool full = (step - 1) % 3 == 0;  // 1, 4, 7
    if (comm.rank() == 0)
      crc = write_dynamic_checkpoint(dir, step, {table_at(step, full, step - 1, crc)}).content_checksums.at(0);
    MPI_Barrier(comm.get());
    save_test_model(comm.get(), dir, step, keep_two);
    if (comm.rank() != 0) continue;
    // Kept: step - 1 and step; each needs its chain down to the newest base at or before it.
    std::vector<std::int64_t> want;
    const std::int64_t base = step - 1 >= 1 ? ((step - 2) / 3) * 3 + 1 : step;
    for (std::int64_t s = std::min(base, step); s <= step; ++s) want.push_back(s);
    const std::vector<std::int64_t> have = list_dynamic_checkpoints(dir);
    if (have != want) {
      all_ok = false;
      std::fprintf(stderr, "after step %lld: %zu dynamic files, want %zu\n", static_cast<long long>(step), have.size(),
                   want.size());
    }
    const DynamicRestore r = restore_dynamic_table(dir, "emb", step - 1 >= 1 ? step - 1 : step);
    all_ok = all_ok && r.warning.empty() && r.state.total_rows == (step - 1 >= 1 ? step - 1 : step) &&
             r.state.ids.size() == static_cast<std::size_t>(r.state.total_rows);
  }
  STRATA_EXPECT_ALL(comm.get(), broadcast_verdict(comm.get(), all_ok));
  remove_dir(comm.get(), dir);
}

TEST(Checkpoint, InconsistentRequestThrowsEverywhere) {
  TestComm comm;
  std::string dir = make_dir(comm.get(), "bad");
  SaveRequest req;
  req.variables = {{"w", {10, 2}, DType::kF32, {}}};
  std::vector<float> w(20, 1.0f);
  // Only rank 0 holds rows [0, 9): row 9 is held by nobody.
  if (comm.rank() == 0) req.shards.push_back({"w", 0, 9, w.data(), {}});
  std::string message;
  try {
    save(comm.get(), dir, 3, req, {});
  } catch (const ConfigError& e) {
    message = e.what();
  }
  STRATA_EXPECT_ALL(comm.get(), message.find("'w'") != std::string::npos);
  STRATA_EXPECT_ALL(comm.get(), !fs::exists(dir + "/ckpt-3.h5") && !fs::exists(dir + "/checkpoint.json"));
  bool missing = false;
  try {
    CheckpointReader r(dir + "/nope.h5");
  } catch (const ConfigError&) {
    missing = true;
  }
  STRATA_EXPECT_ALL(comm.get(), missing);
  remove_dir(comm.get(), dir);
}

}  // namespace
}  // namespace strata::checkpoint
