# What `cmake --install` puts in place, and the CMake package that lets
# another project write
#   find_package(mend REQUIRED)
#   target_link_libraries(app PRIVATE mend::mend)    # the C ABI, mend/mend.h
#   target_link_libraries(app PRIVATE mend::torch)   # the C++ API with LibTorch
#
#  - libmend.so (mend::mend): the C ABI, no LibTorch, only mend_* exported
#    (src/capi/CMakeLists.txt), with include/mend/mend.h;
#  - libmend_torch.so (mend::torch, when built with LibTorch): the C++ API
#    of include/mend/ (Reducer over at::Tensor, DataParallel, the lighthouse,
#    the learner agent, ...), every mend library in one shared object, their
#    dependencies private to it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MEND_INSTALLED_TARGETS mend_shared)
if(MEND_WITH_TORCH)
  set(MEND_TORCH_LIBRARIES mend_reducer ${MEND_CORE_LIBRARIES})
  list(REMOVE_ITEM MEND_TORCH_LIBRARIES mend_capi)
  set(mend_torch_objects "")
  foreach(library ${MEND_TORCH_LIBRARIES})
    list(APPEND mend_torch_objects $<TARGET_OBJECTS:${library}>)
  endforeach()
  add_library(mend_torch SHARED ${PROJECT_SOURCE_DIR}/src/core/package.cc ${mend_torch_objects})
  target_compile_definitions(mend_torch PRIVATE MEND_VERSION="${PROJECT_VERSION}")
  set_target_properties(mend_torch PROPERTIES OUTPUT_NAME mend_torch EXPORT_NAME torch
                        VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
  target_link_libraries(mend_torch PRIVATE ${MEND_TORCH_LIBRARIES})
  target_link_libraries(mend_torch INTERFACE absl::status absl::statusor protobuf::libprotobuf
                        ${TORCH_LIBRARIES})
  target_include_directories(mend_torch INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(mend_torch INTERFACE cxx_std_20)
  add_library(mend::torch ALIAS mend_torch)
  list(APPEND MEND_INSTALLED_TARGETS mend_torch)
  # The C++ API: the Reducer adapter, DataParallel, an embedded lighthouse,
  # and what they include (tests/install/consumer_test.sh checks that every
  # installed header finds what it includes). The rest of include/mend/ is
  # mend's own (buckets, checkpoints, the outer synchronizer, the group
  # store, logging) and is not installed.
  foreach(header agent_options.h clock.h codec.h communicator.h config.h config_enums.h
                 data_parallel.h
                 inner_moments.h learner_agent.h lighthouse.h lighthouse_client.h mend.h
                 reducer.h reducer_stats.h rendezvous_store.h status.h)
    install(FILES ${PROJECT_SOURCE_DIR}/include/mend/${header}
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mend)
  endforeach()
  # The protocol's messages, which the learner agent's decisions are
  # (mend/lighthouse_client.h: QuorumResult, RoundMember, HeartbeatAck).
  install(FILES ${PROJECT_BINARY_DIR}/proto/gen/mend/v1/lighthouse.pb.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mend/v1)
else()
  install(FILES ${PROJECT_SOURCE_DIR}/include/mend/mend.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/mend)
endif()

install(TARGETS ${MEND_INSTALLED_TARGETS} EXPORT mendTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT mendTargets NAMESPACE mend:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mend)
set(MEND_PACKAGE_WITH_TORCH ${MEND_WITH_TORCH})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mendConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/mendConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mend)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/mendConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/mendConfig.cmake ${CMAKE_BINARY_DIR}/mendConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mend)
