// mend checkpoints: the global state of a job (the global parameters and the
// outer optimizer's momentum per tensor, optionally more named tensors such
// as the inner optimizer's moments), the round, step and tokens it was taken
// at, and the configuration, in one self-describing, checksummed file,
// authenticated by the job token when one is given.
//
// The file does not depend on the number of learners: it holds the global
// state, which every learner shares, so a job resumes from it with any
// number of learners.
//
// Layout (little-endian):
//   "MENDCKPT" | u32 format version | u64 header length | header (JSON)
//   | tensor data, each starting at a multiple of 64 bytes
//   | trailer: "MENDEND!" | SHA-256 of every byte before it (version 1)
//            or "MENDMAC!" | HMAC-SHA256 of every byte before it (version 2).
// The header names each tensor: name, dtype ("f32"), shape, offset, bytes and
// its own SHA-256, so that a damaged file is refused naming what is damaged.
//
// Authentication: with a `secret` (the job token), a checkpoint is written
// as version 2, its trailer an HMAC-SHA256 under HMAC-SHA256(token,
// "mend checkpoint v2"), and a read with the secret accepts only a version-2
// file whose MAC verifies: one altered by anyone without the token, or
// written by another job or without authentication, is refused with
// DATA_LOSS like a damaged one. Without a secret a checkpoint is written as
// version 1 (its SHA-256 detects damage, not tampering), and a version-2
// file is refused with UNAUTHENTICATED (it needs the token to verify).
//
// Writes are atomic: a temporary file in the same directory, fsync, rename,
// fsync of the directory. A reader never sees a half-written checkpoint under
// the final name.
//
// Thread-safety: free functions; CheckpointDirectory is not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mend/status.h"

namespace mend {

inline constexpr uint32_t kCheckpointFormatVersion = 2;  // the newest this mend reads

// SHA-256 of `size` bytes (OpenSSL), for checkpoints and the chunks of a
// live heal.
std::array<unsigned char, 32> Sha256Digest(const void* data, size_t size);

struct CheckpointTensor {
  std::string name;  // e.g. "global/blocks.0.qkv.weight"
  std::vector<int64_t> shape;
  std::vector<float> values;  // fp32, shape's product many
};

struct CheckpointMeta {
  std::string job_id;
  uint64_t round_id = 0;  // the last round the state includes
  uint64_t step = 0;      // inner steps of the learner that wrote it
  uint64_t tokens = 0;    // tokens the job had processed (as far as that learner knows)
  int64_t fragments = 1;
  int64_t learners = 0;    // members of the last round (informational)
  std::string written_by;  // learner id
  int64_t created_unix_ms = 0;
  std::string config_toml;  // the writer's effective configuration
  // An exported state's (not a checkpoint file's): the exporting learner's
  // own step and tokens since each fragment's last round, so that an
  // import can go on exactly where it left off. learner_step 0: none.
  uint64_t learner_step = 0;
  std::vector<uint64_t> tokens_since_round;
};

struct Checkpoint {
  CheckpointMeta meta;
  std::vector<CheckpointTensor> tensors;

  // nullptr when there is no tensor of that name.
  const CheckpointTensor* Find(const std::string& name) const;
};

// Writes atomically (see above), authenticated when `secret` is not empty.
// Errors name the path and the failed call.
[[nodiscard]] Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint,
                                     std::string_view secret = {});

// The checkpoint's file contents as bytes, and back (the outer state a
// front end exports and imports, e.g. in a state_dict). Decode verifies
// like ReadCheckpoint; `where` names the bytes in its errors.
[[nodiscard]] StatusOr<std::string> EncodeCheckpoint(const Checkpoint& checkpoint,
                                                     std::string_view secret = {});
[[nodiscard]] StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes,
                                                    const std::string& where,
                                                    std::string_view secret = {});

// Reads and verifies every checksum (and, with a secret, the MAC). DATA_LOSS
// names what is wrong: not a mend checkpoint, an unknown format version,
// truncated (expected vs actual size), a damaged header, the tensor whose
// checksum does not match, a MAC that does not verify, or a file that is not
// authenticated where `secret` asks for it; UNAUTHENTICATED an authenticated
// file read without a secret.
[[nodiscard]] StatusOr<Checkpoint> ReadCheckpoint(const std::string& path,
                                                  std::string_view secret = {});

// The header only (and the file's size), without reading tensor data; for
// `mend checkpoint inspect`.
struct CheckpointSummary {
  CheckpointMeta meta;
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t bytes = 0;
  };
  std::vector<Entry> tensors;
  uint64_t file_bytes = 0;
  uint32_t format_version = 0;
  bool authenticated = false;  // version 2: a MAC under the job token (not verified here)
};
[[nodiscard]] StatusOr<CheckpointSummary> InspectCheckpoint(const std::string& path);

// A directory of checkpoints named ckpt-<round, 12 digits>.mend: writes keep
// the newest `keep` files; LoadLatest returns the newest one that verifies,
// skipping (and reporting in *skipped) damaged ones, which are left in
// place for inspection. Both authenticate with `secret` when it is given.
class CheckpointDirectory {
 public:
  CheckpointDirectory(std::string dir, int keep, std::string secret = {})
      : dir_(std::move(dir)), keep_(keep), secret_(std::move(secret)) {}

  // Writes ckpt-<round>.mend, then removes the oldest beyond `keep` (never
  // the one just written). Returns its path.
  [[nodiscard]] StatusOr<std::string> Save(const Checkpoint& checkpoint);
  // NOT_FOUND when the directory has no checkpoint that verifies.
  [[nodiscard]] StatusOr<Checkpoint> LoadLatest(std::vector<std::string>* skipped = nullptr) const;
  // Checkpoint files, oldest first.
  std::vector<std::string> List() const;
  // Where the checkpoint of round `round_id` is (ckpt-<round, 12 digits>.mend).
  std::string PathOf(uint64_t round_id) const;

 private:
  std::string dir_;
  int keep_;
  std::string secret_;
};

}  // namespace mend
