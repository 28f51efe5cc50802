// Test helper: alter a checkpoint file as someone without the job token
// could: change one value of a tensor and make the tensor's SHA-256 in the
// header (and, for a file without authentication, the trailer's) match, so
// that only a MAC can tell the file was altered.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

#include "fmt/format.h"
#include "mend/checkpoint.h"

namespace mend::testing_util {

namespace checkpoint_edit {

inline uint64_t Field(const std::string& entry, const std::string& key) {
  const size_t at = entry.find("\"" + key + "\":");
  if (at == std::string::npos) throw std::runtime_error("no " + key + " in " + entry);
  return std::stoull(entry.substr(at + key.size() + 3));
}

inline std::string Hex(const std::array<unsigned char, 32>& digest) {
  std::string hex;
  for (unsigned char byte : digest) hex += fmt::format("{:02x}", byte);
  return hex;
}

}  // namespace checkpoint_edit

// Sets value `index` of tensor `name` in the checkpoint at `path` to `value`.
inline void AlterCheckpointValue(const std::string& path, const std::string& name, size_t index,
                                 float value) {
  using namespace checkpoint_edit;
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + 12, 8);  // little-endian hosts
  const size_t data_start = (20 + header_bytes + 63) / 64 * 64;
  const size_t named = bytes.find("\"name\":\"" + name + "\"", 20);
  if (named == std::string::npos || named > 20 + header_bytes)
    throw std::runtime_error("no tensor " + name + " in " + path);
  const size_t begin = bytes.rfind('{', named), end = bytes.find('}', named);
  const std::string entry = bytes.substr(begin, end - begin);
  const size_t offset = data_start + Field(entry, "offset");
  const size_t size = Field(entry, "bytes");
  const size_t sha = bytes.find("\"sha256\":\"", begin) + 10;
  std::memcpy(bytes.data() + offset + index * sizeof(float), &value, sizeof(float));
  const std::string hex = Hex(Sha256Digest(bytes.data() + offset, size));
  bytes.replace(sha, hex.size(), hex);
  const size_t trailer = bytes.size() - 40;
  if (bytes.compare(trailer, 8, "MENDEND!") == 0) {  // a plain SHA-256 anyone can redo
    const auto digest = Sha256Digest(bytes.data(), trailer);
    std::memcpy(bytes.data() + trailer + 8, digest.data(), digest.size());
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace mend::testing_util
