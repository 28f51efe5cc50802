# The installable C++ package: libmend.so (every mend library in one shared
# object, their dependencies private to it), the API headers of
# include/mend/, and a CMake package so that another project can write
#   find_package(mend REQUIRED)
#   target_link_libraries(app PRIVATE mend::mend)
# The API uses abseil's Status and LibTorch's at::Tensor, so mendConfig.cmake
# finds those too.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MEND_PACKAGED_LIBRARIES
    mend_reducer mend_rounds mend_checkpoint mend_outer mend_dataplane mend_codecs mend_lighthouse
    mend_lighthouse_client mend_coordinator_state mend_datagram mend_proto mend_core)
set_target_properties(${MEND_PACKAGED_LIBRARIES} PROPERTIES POSITION_INDEPENDENT_CODE ON)

# Every object of the packaged libraries goes in; linking the same static
# libraries as well brings their dependencies (gRPC, Gloo, LibTorch, ...)
# and adds nothing twice (an archive member is only taken for a symbol still
# undefined).
set(mend_objects "")
foreach(library ${MEND_PACKAGED_LIBRARIES})
  list(APPEND mend_objects $<TARGET_OBJECTS:${library}>)
endforeach()
add_library(mend_shared SHARED ${PROJECT_SOURCE_DIR}/src/core/package.cc ${mend_objects})
target_compile_definitions(mend_shared PRIVATE MEND_VERSION="${PROJECT_VERSION}")
set_target_properties(mend_shared PROPERTIES OUTPUT_NAME mend EXPORT_NAME mend
                      VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
target_link_libraries(mend_shared PRIVATE ${MEND_PACKAGED_LIBRARIES})
target_link_libraries(mend_shared INTERFACE absl::status absl::statusor ${TORCH_LIBRARIES})
target_include_directories(mend_shared INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(mend_shared INTERFACE cxx_std_20)
add_library(mend::mend ALIAS mend_shared)

install(TARGETS mend_shared EXPORT mendTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mend DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT mendTargets NAMESPACE mend:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mend)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mendConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/mendConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mend)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/mendConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/mendConfig.cmake ${CMAKE_BINARY_DIR}/mendConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/mend)
