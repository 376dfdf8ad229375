#include "strata/comm/transport.h"

#include <algorithm>
#include <string>

#include "strata/common/error.h"

namespace strata::comm {

Transport::~Transport() = default;

void Transport::put_notify(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                           std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                           std::uint64_t readback_offset) {
  if (piece_bytes == 0) throw Error("put_notify: piece_bytes is 0");
  const auto* p = static_cast<const char*>(src);
  const std::int64_t one = 1;
  const bool ordered = ordered_to(peer);  // else a flush puts each piece before its count
  for (std::size_t done = 0; done < bytes; done += piece_bytes) {
    const std::size_t len = std::min(piece_bytes, bytes - done);
    put(region, peer, offset + done, p + done, len);
    if (!ordered) flush(region, peer);
    accumulate(region, peer, counter_offset, &one, 1, ElemType::kI64);
  }
  if (readback) {
    if (!ordered) flush(region, peer);
    get(region, peer, readback_offset, readback, sizeof *readback);
  }
}

void Transport::put_notify_get(Region& region, int peer, std::uint64_t offset, const void* src, std::size_t bytes,
                               std::size_t piece_bytes, std::uint64_t counter_offset, std::int64_t* readback,
                               std::uint64_t readback_offset, std::uint64_t get_offset, void* dst,
                               std::size_t get_bytes) {
  if (!readback) throw Error("put_notify_get: no read-back word");
  put_notify(region, peer, offset, src, bytes, piece_bytes, counter_offset, readback, readback_offset);
  if (!ordered_to(peer)) flush(region, peer);
  get(region, peer, get_offset, dst, get_bytes);
  // Unordered (UCX between nodes): a later write to the same bytes could overtake this get, so the
  // answer is taken in now; the answer is then this request's, as the contract says.
  if (!ordered_to(peer)) flush(region, peer);
}

std::size_t elem_size(ElemType type) {
  switch (type) {
    case ElemType::kF32: return 4;
    case ElemType::kF64: return 8;
    case ElemType::kI64: return 8;
  }
  // Only a value that is none of the enumerators gets here (cast from bytes): never 0, which a
  // caller would divide by.
  throw Error("element type " + std::to_string(static_cast<int>(type)) + " does not exist");
}

const char* to_string(ElemType type) {
  switch (type) {
    case ElemType::kF32: return "float";
    case ElemType::kF64: return "double";
    case ElemType::kI64: return "int64";
  }
  return "?";
}

}  // namespace strata::comm
