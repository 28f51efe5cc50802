// FreeLoopbackPorts: distinct ports that can be listened on, and none from
// the kernel's ephemeral range, where an outgoing connection could take a
// port between a process's exit and its restart on it.
#include "core/free_ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "gtest/gtest.h"

namespace mend {
namespace {

bool Listens(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

TEST(FreeLoopbackPortsTest, DistinctListenablePortsBelowTheEphemeralRange) {
  auto ports = FreeLoopbackPorts(8);
  ASSERT_TRUE(ports.ok()) << ports.status();
  ASSERT_EQ(ports->size(), 8u);
  EXPECT_EQ(std::set<int>(ports->begin(), ports->end()).size(), 8u);
  int ephemeral_start = 0;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_start;
  for (int port : *ports) {
    EXPECT_TRUE(Listens(port)) << port;
    EXPECT_GE(port, 1024);
    if (ephemeral_start > 10'100) {
      EXPECT_LT(port, ephemeral_start) << port;
    }
  }
}

}  // namespace
}  // namespace mend
