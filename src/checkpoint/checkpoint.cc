#include "mend/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string_view>

#include "core/hmac.h"
#include "core/status_format.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "openssl/crypto.h"
#include "openssl/evp.h"

namespace mend {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kMagic[8] = {'M', 'E', 'N', 'D', 'C', 'K', 'P', 'T'};
constexpr char kTrailerMagic[8] = {'M', 'E', 'N', 'D', 'E', 'N', 'D', '!'};
constexpr char kMacTrailerMagic[8] = {'M', 'E', 'N', 'D', 'M', 'A', 'C', '!'};
constexpr uint32_t kPlainVersion = 1;          // SHA-256 trailer
constexpr uint32_t kAuthenticatedVersion = 2;  // HMAC-SHA256 trailer
constexpr std::string_view kKeyLabel = "mend checkpoint v2";
constexpr size_t kPrefixBytes = 8 + 4 + 8;
constexpr size_t kTrailerBytes = 8 + 32;
constexpr size_t kAlign = 64;
constexpr uint64_t kMaxHeaderBytes = 64ull << 20;

std::string Sha256Hex(const void* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data, size, digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

void Sha256(const void* data, size_t size, unsigned char out[32]) {
  unsigned int length = 0;
  EVP_Digest(data, size, out, &length, EVP_sha256(), nullptr);
}

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The trailer's digest of every byte before it: SHA-256 without a secret
// (version 1), HMAC-SHA256 under HMAC-SHA256(secret, kKeyLabel) with one
// (version 2).
class TrailerDigest {
 public:
  explicit TrailerDigest(std::string_view secret) {
    if (secret.empty()) {
      md_ = EVP_MD_CTX_new();
      EVP_DigestInit_ex(md_, EVP_sha256(), nullptr);
      return;
    }
    Sha256Bytes key = DeriveHmacKey(secret, kKeyLabel);
    mac_.emplace(key);
    OPENSSL_cleanse(key.data(), key.size());
  }
  ~TrailerDigest() { EVP_MD_CTX_free(md_); }
  TrailerDigest(const TrailerDigest&) = delete;
  TrailerDigest& operator=(const TrailerDigest&) = delete;

  void Update(const void* data, size_t size) {
    if (md_ != nullptr) EVP_DigestUpdate(md_, data, size);
    if (mac_) mac_->Update(data, size);
  }
  Sha256Bytes Final() {
    if (mac_) return mac_->Final();
    Sha256Bytes out{};
    unsigned int md_length = 0;
    EVP_DigestFinal_ex(md_, out.data(), &md_length);
    return out;
  }
  const char* magic() const { return mac_ ? kMacTrailerMagic : kTrailerMagic; }
  uint32_t version() const { return mac_ ? kAuthenticatedVersion : kPlainVersion; }

 private:
  EVP_MD_CTX* md_ = nullptr;
  std::optional<HmacSha256> mac_;
};

template <typename T>
void PutLittle(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

template <typename T>
T GetLittle(const char* p) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    value |= static_cast<T>(static_cast<unsigned char>(p[i])) << (8 * i);
  return value;
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

json MetaToJson(const CheckpointMeta& m) {
  json j = {{"job_id", m.job_id},
            {"round_id", m.round_id},
            {"step", m.step},
            {"tokens", m.tokens},
            {"fragments", m.fragments},
            {"learners", m.learners},
            {"written_by", m.written_by},
            {"created_unix_ms", m.created_unix_ms},
            {"config", m.config_toml}};
  if (m.learner_step > 0)
    j["learner"] = {{"step", m.learner_step}, {"tokens_since_round", m.tokens_since_round}};
  return j;
}

Status MetaFromJson(const json& j, CheckpointMeta* m) {
  try {
    m->job_id = j.at("job_id").get<std::string>();
    m->round_id = j.at("round_id").get<uint64_t>();
    m->step = j.at("step").get<uint64_t>();
    m->tokens = j.at("tokens").get<uint64_t>();
    m->fragments = j.at("fragments").get<int64_t>();
    m->learners = j.at("learners").get<int64_t>();
    m->written_by = j.at("written_by").get<std::string>();
    m->created_unix_ms = j.at("created_unix_ms").get<int64_t>();
    m->config_toml = j.at("config").get<std::string>();
    if (j.contains("learner")) {
      m->learner_step = j.at("learner").at("step").get<uint64_t>();
      m->tokens_since_round = j.at("learner").at("tokens_since_round").get<std::vector<uint64_t>>();
    }
  } catch (const json::exception& error) {
    return DataLossError(fmt::format("header: {}", error.what()));
  }
  return OkStatus();
}

// A failed system call on a checkpoint file, by what the host said: a full
// disk or quota is RESOURCE_EXHAUSTED, a read-only or forbidden place
// FAILED_PRECONDITION, a missing directory NOT_FOUND; nothing of it is
// mend's own INTERNAL error, except what no host explains.
Status Errno(const std::string& what, const std::string& path) {
  const int error = errno;
  std::string message = fmt::format("checkpoint {}: {}: {}", path, what, std::strerror(error));
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return ResourceExhaustedError(std::move(message));
    case EACCES:
    case EPERM:
    case EROFS:
      return FailedPreconditionError(std::move(message));
    case ENOENT:
    case ENOTDIR:
      return NotFoundError(std::move(message));
    default:
      return InternalError(std::move(message));
  }
}

Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

// The header and where each tensor's data goes; verifies the prefix.
struct Parsed {
  uint32_t version = 0;
  json header;
  size_t data_start = 0;
};

StatusOr<Parsed> ParsePrefix(const std::string& path, std::string_view bytes_head,
                             uint64_t file_size) {
  auto bad = [&](const std::string& why) {
    return DataLossError(fmt::format("checkpoint {}: {}", path, why));
  };
  if (file_size < kPrefixBytes + kTrailerBytes || std::memcmp(bytes_head.data(), kMagic, 8) != 0) {
    return bad("not a mend checkpoint (no MENDCKPT magic)");
  }
  Parsed parsed;
  parsed.version = GetLittle<uint32_t>(bytes_head.data() + 8);
  if (parsed.version < kPlainVersion || parsed.version > kCheckpointFormatVersion) {
    return bad(fmt::format("format version {} (this mend reads versions {} to {})", parsed.version,
                           kPlainVersion, kCheckpointFormatVersion));
  }
  const uint64_t header_bytes = GetLittle<uint64_t>(bytes_head.data() + 12);
  if (header_bytes > kMaxHeaderBytes || kPrefixBytes + header_bytes + kTrailerBytes > file_size) {
    return bad(fmt::format("truncated: the header claims {} bytes but the file has {}",
                           header_bytes, file_size));
  }
  if (bytes_head.size() < kPrefixBytes + header_bytes) return bad("short read of the header");
  parsed.header = json::parse(bytes_head.substr(kPrefixBytes, header_bytes), nullptr, false);
  if (!parsed.header.is_object() || !parsed.header.contains("tensors") ||
      !parsed.header["tensors"].is_array()) {
    return bad("damaged header (not the expected JSON)");
  }
  parsed.data_start = AlignUp(kPrefixBytes + header_bytes);
  return parsed;
}

StatusOr<std::string> ReadFile(const std::string& path, uint64_t limit) {
  // A directory opens as a stream whose end cannot be told: refused first.
  std::error_code error;
  if (fs::is_directory(path, error)) {
    return InvalidArgumentError(
        fmt::format("checkpoint {}: is a directory, not a checkpoint file", path));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return NotFoundError(fmt::format("checkpoint {}: cannot open: {}", path, std::strerror(errno)));
  std::string bytes;
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  if (!in || end < 0)
    return DataLossError(fmt::format("checkpoint {}: cannot tell its size", path));
  const auto size = static_cast<uint64_t>(end);
  in.seekg(0);
  bytes.resize(std::min(size, limit));
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!in) return DataLossError(fmt::format("checkpoint {}: read failed", path));
  return bytes;
}

}  // namespace

std::array<unsigned char, 32> Sha256Digest(const void* data, size_t size) {
  std::array<unsigned char, 32> digest{};
  Sha256(data, size, digest.data());
  return digest;
}

const CheckpointTensor* Checkpoint::Find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

// The prefix: magic, version, header length, the JSON header naming every
// tensor (offset, bytes, checksum), padded to the data's alignment.
StatusOr<std::string> EncodePrefix(const Checkpoint& checkpoint, const std::string& where,
                                   uint32_t version) {
  json tensors = json::array();
  size_t offset = 0;
  for (const CheckpointTensor& t : checkpoint.tensors) {
    if (Product(t.shape) != static_cast<int64_t>(t.values.size())) {
      return InvalidArgumentError(
          fmt::format("checkpoint {}: tensor '{}' has {} values for shape of {}", where, t.name,
                      t.values.size(), Product(t.shape)));
    }
    const size_t bytes = t.values.size() * sizeof(float);
    tensors.push_back({{"name", t.name},
                       {"dtype", "f32"},
                       {"shape", t.shape},
                       {"offset", offset},
                       {"bytes", bytes},
                       {"sha256", Sha256Hex(t.values.data(), bytes)}});
    offset = AlignUp(offset + bytes);
  }
  json header = {
      {"format", "mend checkpoint"}, {"meta", MetaToJson(checkpoint.meta)}, {"tensors", tensors}};
  const std::string header_text = header.dump();
  std::string prefix(kMagic, 8);
  PutLittle<uint32_t>(prefix, version);
  PutLittle<uint64_t>(prefix, header_text.size());
  prefix += header_text;
  prefix.resize(AlignUp(prefix.size()), '\0');
  return prefix;
}

// Feeds `put` the whole encoding: the prefix, each tensor's data padded to
// the alignment, and the trailer (magic and the digest of all before it).
template <typename Put>
Status EncodeInto(const Checkpoint& checkpoint, const std::string& where, std::string_view secret,
                  Put&& put) {
  TrailerDigest digest(secret);
  MEND_ASSIGN_OR_RETURN(const std::string prefix,
                        EncodePrefix(checkpoint, where, digest.version()));
  auto hashed = [&](const char* data, size_t size) {
    digest.Update(data, size);
    return put(data, size);
  };
  Status status = hashed(prefix.data(), prefix.size());
  const std::string zeros(kAlign, '\0');
  for (size_t i = 0; status.ok() && i < checkpoint.tensors.size(); ++i) {
    const auto& values = checkpoint.tensors[i].values;
    const size_t bytes = values.size() * sizeof(float);
    status = hashed(reinterpret_cast<const char*>(values.data()), bytes);
    if (status.ok() && AlignUp(bytes) != bytes)
      status = hashed(zeros.data(), AlignUp(bytes) - bytes);
  }
  if (!status.ok()) return status;
  const std::array<unsigned char, 32> sum = digest.Final();
  std::string trailer(digest.magic(), 8);
  trailer.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  return put(trailer.data(), trailer.size());
}

}  // namespace

StatusOr<std::string> EncodeCheckpoint(const Checkpoint& checkpoint, std::string_view secret) {
  std::string bytes;
  MEND_RETURN_IF_ERROR(
      EncodeInto(checkpoint, "(in memory)", secret, [&](const char* data, size_t size) {
        bytes.append(data, size);
        return OkStatus();
      }));
  return bytes;
}

Status WriteCheckpoint(const std::string& path, const Checkpoint& checkpoint,
                       std::string_view secret) {
  const fs::path final_path(path);
  const fs::path dir = final_path.has_parent_path() ? final_path.parent_path() : fs::path(".");
  std::random_device random;
  const std::string temp =
      (dir / fmt::format(".{}.tmp-{:08x}", final_path.filename().string(), random())).string();
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create " + temp, path);
  Status status = EncodeInto(checkpoint, path, secret, [&](const char* data, size_t size) {
    return WriteAll(fd, data, size, path);
  });
  if (status.ok() && ::fsync(fd) != 0) status = Errno("fsync", path);
  if (::close(fd) != 0 && status.ok()) status = Errno("close", path);
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) status = Errno("rename", path);
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  // The rename is durable once the directory is.
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return OkStatus();
}

namespace {

// A file authenticated (version 2) where a secret is given, and only there.
Status CheckAuthenticated(const Parsed& parsed, std::string_view secret, const std::string& path) {
  const bool authenticated = parsed.version == kAuthenticatedVersion;
  if (!secret.empty() && !authenticated) {
    return DataLossError(fmt::format(
        "checkpoint {}: not authenticated (format version 1: written without a job token, or with "
        "checkpoint_authenticate = false); a learner with a job token reads only checkpoints "
        "that token authenticates (set checkpoint_authenticate = false to read this one)",
        path));
  }
  if (secret.empty() && authenticated) {
    return UnauthenticatedError(fmt::format(
        "checkpoint {}: authenticated by a job token (format version 2); reading it needs the "
        "job's token (MEND_JOB_TOKEN) and checkpoint_authenticate = true",
        path));
  }
  return OkStatus();
}

// The trailer: the SHA-256 (no secret) or the MAC under `secret` of every
// byte before it (CheckAuthenticated chose which the file must have).
Status CheckTrailer(std::string_view bytes, std::string_view secret, const std::string& path) {
  const size_t body_end = bytes.size() - kTrailerBytes;
  TrailerDigest digest(secret);
  auto bad = [&](const std::string& why) {
    return DataLossError(fmt::format("checkpoint {}: {}", path, why));
  };
  if (std::memcmp(bytes.data() + body_end, digest.magic(), 8) != 0)
    return bad(fmt::format("no {} trailer (truncated)", std::string_view(digest.magic(), 8)));
  digest.Update(bytes.data(), body_end);
  const std::array<unsigned char, 32> sum = digest.Final();
  if (CRYPTO_memcmp(sum.data(), bytes.data() + body_end + 8, sum.size()) == 0) return OkStatus();
  if (!secret.empty()) {
    return bad(
        "authentication failed: the MAC does not verify (altered, or written with another job "
        "token)");
  }
  return bad("file checksum mismatch");
}

}  // namespace

StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes, const std::string& where,
                                      std::string_view secret) {
  const std::string& path = where;
  MEND_ASSIGN_OR_RETURN(Parsed parsed, ParsePrefix(path, bytes, bytes.size()));
  auto bad = [&](const std::string& why) {
    return DataLossError(fmt::format("checkpoint {}: {}", path, why));
  };
  MEND_RETURN_IF_ERROR(CheckAuthenticated(parsed, secret, path));
  const size_t body_end = bytes.size() - kTrailerBytes;
  Checkpoint checkpoint;
  MEND_RETURN_IF_ERROR(MetaFromJson(parsed.header.value("meta", json::object()), &checkpoint.meta));
  uint64_t expected_end = parsed.data_start;
  for (const json& entry : parsed.header["tensors"]) {
    CheckpointTensor tensor;
    uint64_t offset = 0, size = 0;
    std::string sha;
    try {
      tensor.name = entry.at("name").get<std::string>();
      tensor.shape = entry.at("shape").get<std::vector<int64_t>>();
      offset = entry.at("offset").get<uint64_t>();
      size = entry.at("bytes").get<uint64_t>();
      sha = entry.at("sha256").get<std::string>();
      if (entry.at("dtype").get<std::string>() != "f32")
        return bad(fmt::format("tensor '{}': dtype is not f32", tensor.name));
    } catch (const json::exception& error) {
      return bad(fmt::format("damaged header entry: {}", error.what()));
    }
    if (Product(tensor.shape) < 0 ||
        static_cast<uint64_t>(Product(tensor.shape)) * sizeof(float) != size) {
      return bad(fmt::format("tensor '{}': {} bytes do not match its shape", tensor.name, size));
    }
    if (parsed.data_start + offset + size > body_end) {
      return bad(fmt::format("truncated: tensor '{}' ends at byte {} but the data ends at {}",
                             tensor.name, parsed.data_start + offset + size, body_end));
    }
    const char* data = bytes.data() + parsed.data_start + offset;
    if (Sha256Hex(data, size) != sha)
      return bad(fmt::format("tensor '{}': checksum mismatch", tensor.name));
    tensor.values.resize(size / sizeof(float));
    std::memcpy(tensor.values.data(), data, size);
    expected_end = std::max<uint64_t>(expected_end, parsed.data_start + AlignUp(offset + size));
    checkpoint.tensors.push_back(std::move(tensor));
  }
  if (expected_end != body_end) {
    return bad(fmt::format("truncated or padded: the data should end at byte {} but ends at {}",
                           expected_end, body_end));
  }
  MEND_RETURN_IF_ERROR(CheckTrailer(bytes, secret, path));
  return checkpoint;
}

StatusOr<Checkpoint> ReadCheckpoint(const std::string& path, std::string_view secret) {
  MEND_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path, UINT64_MAX));
  return DecodeCheckpoint(bytes, path, secret);
}

StatusOr<CheckpointSummary> InspectCheckpoint(const std::string& path) {
  // ReadFile first: it names a directory as such.
  MEND_ASSIGN_OR_RETURN(std::string head, ReadFile(path, kPrefixBytes + kMaxHeaderBytes));
  std::error_code error;
  const uint64_t size = fs::file_size(path, error);
  if (error) return NotFoundError(fmt::format("checkpoint {}: {}", path, error.message()));
  MEND_ASSIGN_OR_RETURN(Parsed parsed, ParsePrefix(path, head, size));
  CheckpointSummary summary;
  summary.file_bytes = size;
  summary.format_version = parsed.version;
  summary.authenticated = parsed.version == kAuthenticatedVersion;
  MEND_RETURN_IF_ERROR(MetaFromJson(parsed.header.value("meta", json::object()), &summary.meta));
  for (const json& entry : parsed.header["tensors"]) {
    CheckpointSummary::Entry e;
    e.name = entry.value("name", "");
    e.shape = entry.value("shape", std::vector<int64_t>{});
    e.bytes = entry.value("bytes", uint64_t{0});
    summary.tensors.push_back(std::move(e));
  }
  return summary;
}

std::vector<std::string> CheckpointDirectory::List() const {
  std::vector<std::string> files;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && entry.path().extension() == ".mend")
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());  // zero-padded round ids sort by round
  return files;
}

std::string CheckpointDirectory::PathOf(uint64_t round_id) const {
  return (fs::path(dir_) / fmt::format("ckpt-{:012d}.mend", round_id)).string();
}

StatusOr<std::string> CheckpointDirectory::Save(const Checkpoint& checkpoint) {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error)
    return InternalError(fmt::format("checkpoint directory {}: {}", dir_, error.message()));
  const std::string path = PathOf(checkpoint.meta.round_id);
  MEND_RETURN_IF_ERROR(WriteCheckpoint(path, checkpoint, secret_));
  std::vector<std::string> files = List();
  for (size_t i = 0; i + static_cast<size_t>(keep_) < files.size(); ++i) {
    if (files[i] != path) fs::remove(files[i], error);
  }
  return path;
}

StatusOr<Checkpoint> CheckpointDirectory::LoadLatest(std::vector<std::string>* skipped) const {
  std::vector<std::string> files = List();
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    StatusOr<Checkpoint> checkpoint = ReadCheckpoint(*it, secret_);
    if (checkpoint.ok()) return checkpoint;
    if (skipped) skipped->push_back(std::string(checkpoint.status().message()));
  }
  return NotFoundError(fmt::format("no checkpoint that verifies in {} ({} damaged)", dir_,
                                   skipped ? skipped->size() : 0));
}

}  // namespace mend
