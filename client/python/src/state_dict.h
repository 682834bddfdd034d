// cairn._cairn.StateDict: a client::StateDict over caller-owned memory, plus
// the storage of its bytes entries.
//
// Tensor chunks are borrowed (address + length, e.g. tensor.data_ptr()): the
// Python caller keeps their owners alive and unchanged (save) or writable
// (load) while a save or load runs. Bytes entries are copied into strings the
// StateDict owns, so libcairn saves from and loads into them; get_bytes reads
// the current (after a load: loaded) value.
#ifndef CAIRN_CLIENT_PYTHON_SRC_STATE_DICT_H_
#define CAIRN_CLIENT_PYTHON_SRC_STATE_DICT_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "client/state_dict.h"

namespace cairn::python {

// One chunk as Python passes it: (offsets, sizes, ptr, nbytes).
using PyChunk =
    std::tuple<std::vector<int64_t>, std::vector<int64_t>, uintptr_t, uint64_t>;

// Python calls it with the GIL held. A save or load uses it with the GIL
// released, so while one runs (an InUse is alive) other Python threads may
// not change it: add_chunks and add_bytes raise FailedPreconditionError, and
// so do get_bytes while a load writes the entries and a second save or load
// that would conflict (a load with anything else).
class PyStateDict {
 public:
  // Marks the StateDict used by a save (kRead) or a load (kWrite) for its
  // lifetime; FailedPreconditionError if that conflicts with a running one.
  // Create and destroy with the GIL held.
  enum class Access { kRead, kWrite };
  class InUse {
   public:
    InUse(const PyStateDict& state, Access access);
    ~InUse();
    InUse(const InUse&) = delete;
    InUse& operator=(const InUse&) = delete;

   private:
    const PyStateDict& state_;
    const Access access_;
  };

  PyStateDict() = default;
  PyStateDict(const PyStateDict&) = delete;
  PyStateDict& operator=(const PyStateDict&) = delete;

  // Raises InvalidArgumentError naming `fqn` as client::StateDict::AddChunks
  // does, and for an unknown dtype or a null ptr with nbytes > 0.
  void AddChunks(const std::string& fqn, const std::string& dtype,
                 std::vector<int64_t> global_shape,
                 const std::vector<PyChunk>& chunks);
  // `data` is the value to save; None registers an empty entry to load into.
  void AddBytes(const std::string& fqn, std::optional<pybind11::bytes> data);
  // The entry's current value; NotFoundError naming `fqn` if there is none.
  pybind11::bytes GetBytes(const std::string& fqn) const;
  size_t size() const;

  const client::StateDict& state() const { return state_; }
  client::StateDict& state() { return state_; }

 private:
  // FailedPreconditionError naming `call` and `fqn` while a load runs, or
  // (unless `read_only`) a save.
  void CheckNotInUse(const char* call, const std::string& fqn,
                     bool read_only) const;

  // Running saves and loads using this StateDict (guarded by the GIL).
  mutable int readers_ = 0;
  mutable int writers_ = 0;
  client::StateDict state_;
  // Blob storage: stable addresses (client::BytesEntry points into them).
  std::vector<std::unique_ptr<std::string>> blobs_;
  absl::flat_hash_map<std::string, const std::string*> blob_by_fqn_;
};

void RegisterStateDict(pybind11::module_& m);

}  // namespace cairn::python

#endif  // CAIRN_CLIENT_PYTHON_SRC_STATE_DICT_H_
