#include "core/free_ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "fmt/format.h"

namespace mend {
namespace {

// Where the picks go: [kLowestPort, the ephemeral range's first port).
constexpr int kLowestPort = 10000;
constexpr int kTriesPerPort = 200;

int EphemeralRangeStart() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(range >> low)) return 0;
  return low;
}

// Binds `fd` to loopback:`port` (0: the kernel's pick); returns the port
// bound, or -1.
int BindLoopback(int fd, int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof address;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return -1;
  }
  return static_cast<int>(ntohs(address.sin_port));
}

}  // namespace

StatusOr<std::vector<int>> FreeLoopbackPorts(int count) {
  const int ephemeral_start = EphemeralRangeStart();
  const bool below = ephemeral_start > kLowestPort + 4 * count;
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(kLowestPort, below ? ephemeral_start - 1 : kLowestPort);
  std::vector<int> fds;
  std::vector<int> ports;
  Status status = OkStatus();
  for (int i = 0; i < count && status.ok(); ++i) {
    int port = -1;
    for (int attempt = 0; attempt < kTriesPerPort && port < 0; ++attempt) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      // Without a range below the ephemeral one, the kernel's pick.
      port = BindLoopback(fd, below ? pick(random) : 0);
      if (port < 0) {
        close(fd);
      } else {
        fds.push_back(fd);
      }
    }
    if (port < 0) {
      status = UnavailableError(fmt::format("cannot pick a free loopback port: {}",
                                            errno != 0 ? std::strerror(errno) : "none free"));
    } else {
      ports.push_back(port);
    }
  }
  for (int fd : fds) close(fd);
  if (!status.ok()) return status;
  return ports;
}

}  // namespace mend
