# Gathers tfhost and the shared libraries it needs that a plain Linux system
# may lack into one relocatable folder (the binary finds them through its
# $ORIGIN run path). glibc, libgcc and libstdc++ and the NVIDIA driver stay
# the system's; the CUDA Toolkit's libraries (cuBLAS, ~600 MB) are copied
# only with -DTF_BUNDLE_CUDA_LIBS=ON, otherwise they are found where the
# system's loader finds them (its folders, LD_LIBRARY_PATH) or, for cuBLAS,
# in the toolkit's folder (kernels/cuda/cublas_load.cu).
# Usage: cmake -DBIN=<tfhost> -DOUT=<dir> -DBUNDLE_CUDA=ON|OFF [-DOPENED=<lib>|<lib>...] -P bundle.cmake
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
file(COPY ${BIN} DESTINATION ${OUT})
set(system_libs
  "^/lib64/ld-linux" "/ld-linux[^/]*$" "/libc\\.so" "/libm\\.so" "/libdl\\.so" "/libpthread\\.so" "/librt\\.so"
  "/libgcc_s\\.so" "/libstdc\\+\\+\\.so" "/libcuda\\.so" "/libnvidia-")
# MPI stays the system's: its library must match the mpirun that starts the
# ranks and the plugins installed beside it.
list(APPEND system_libs "/libmpi\\.so" "/libopen-rte" "/libopen-pal" "/libhwloc" "/libevent" "/libpmix" "/libudev")
if(NOT BUNDLE_CUDA)
  list(APPEND system_libs "/libcublas" "/libcupti" "/libcudart" "/libnvToolsExt" "/libnvrtc" "/libnccl")
endif()
file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES ${BIN}
  RESOLVED_DEPENDENCIES_VAR deps
  UNRESOLVED_DEPENDENCIES_VAR missing
  POST_EXCLUDE_REGEXES ${system_libs})
foreach(lib ${deps})
  file(COPY ${lib} DESTINATION ${OUT} FOLLOW_SYMLINK_CHAIN)
  get_filename_component(name ${lib} NAME)
  message(STATUS "bundle: ${name}")
endforeach()
# Libraries tfhost opens at run time (cuBLAS): no dependency list names them.
if(BUNDLE_CUDA AND OPENED)
  string(REPLACE "|" ";" opened "${OPENED}")
  foreach(lib ${opened})
    file(COPY ${lib} DESTINATION ${OUT} FOLLOW_SYMLINK_CHAIN)
    get_filename_component(name ${lib} NAME)
    message(STATUS "bundle: ${name} (opened at run time)")
  endforeach()
endif()
if(missing)
  message(WARNING "bundle: unresolved libraries: ${missing}")
endif()
message(STATUS "bundle: ${OUT}/tfhost is ready; copy the folder anywhere and run it from there")
