# Every dependency comes from Debian 12 packages (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
find_program(GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)
# LibTorch (Debian's CPU build 1.13) for the reducer; found here, at the top,
# so that its imported targets are visible to every directory.
if(MEND_WITH_TORCH)
  find_package(Torch REQUIRED)
endif()
