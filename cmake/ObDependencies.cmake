# Finds every dependency once, so targets below only name them.
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)

# The control plane: libuv (event loop) and libsodium (HMAC for agent auth).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(OB_UV QUIET libuv)
endif()
if(NOT OB_UV_FOUND)
  find_library(OB_UV_LIBRARIES uv REQUIRED)
  find_path(OB_UV_INCLUDE_DIRS uv.h REQUIRED)
else()
  set(OB_UV_LIBRARIES ${OB_UV_LINK_LIBRARIES})
endif()
find_library(OB_SODIUM_LIBRARY sodium REQUIRED)

# LibTorch: Debian's libtorch-dev (1.13, CPU) or a CUDA LibTorch 2.x given
# through CMAKE_PREFIX_PATH (e.g. the PyTorch wheel's share/cmake).
find_package(Torch REQUIRED)
# TorchConfig appends its flags (the C++11 ABI define) to CMAKE_CXX_FLAGS.
message(STATUS "ob: LibTorch ${Torch_VERSION}")

# The PyTorch wheel ships protobuf headers of its own (torch/include/google,
# protobuf 3.13) in a directory that every torch target puts on the include
# path, before ours: our generated .pb.h then meet the wrong protobuf. Put a
# directory holding only a link to our protobuf's google/ ahead of them all.
foreach(_dir ${TORCH_INCLUDE_DIRS})
  if(EXISTS "${_dir}/google/protobuf/message.h")
    get_filename_component(_theirs "${_dir}/google" REALPATH)
    get_filename_component(_ours "${Protobuf_INCLUDE_DIRS}/google" REALPATH)
    if(NOT _theirs STREQUAL _ours)
      set(_first "${CMAKE_BINARY_DIR}/protobuf-first")
      file(MAKE_DIRECTORY "${_first}")
      file(CREATE_LINK "${_ours}" "${_first}/google" SYMBOLIC)
      include_directories(BEFORE SYSTEM "${_first}")
      message(STATUS "ob: ${_dir}/google shadowed by ${_ours}")
    endif()
  endif()
endforeach()

set(OB_HAVE_CUDA OFF)
if(OB_CUDA STREQUAL "ON" OR (OB_CUDA STREQUAL "AUTO" AND TARGET torch_cuda))
  if(NOT TARGET torch_cuda)
    message(FATAL_ERROR "ob: OB_CUDA=ON but LibTorch ${Torch_VERSION} was built without CUDA")
  endif()
  find_path(OB_NCCL_INCLUDE_DIR nccl.h
    HINTS $ENV{NCCL_ROOT}/include ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(OB_NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS $ENV{NCCL_ROOT}/lib ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(NOT OB_NCCL_INCLUDE_DIR OR NOT OB_NCCL_LIBRARY)
    message(FATAL_ERROR "ob: CUDA LibTorch found but no NCCL; set NCCL_ROOT")
  endif()
  file(STRINGS ${OB_NCCL_INCLUDE_DIR}/nccl.h _nccl_ver REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
         OB_NCCL_VERSION "${_nccl_ver}")
  set(OB_HAVE_CUDA ON)
  message(STATUS "ob: CUDA paths on, NCCL ${OB_NCCL_VERSION} at ${OB_NCCL_LIBRARY}")
  # ob's own kernels (lib/ob/model/fused_loss.cu) where the toolkit has nvcc;
  # without it the same operations run as ATen's kernels. Here, at the top
  # level, because the executables link them.
  include(CheckLanguage)
  check_language(CUDA)
  set(OB_HAVE_CUDA_KERNELS OFF)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(OB_HAVE_CUDA_KERNELS ON)
    # The cuBLAS that LibTorch itself loads (a wheel's, say) when given, so
    # that one library of that name serves both; else the toolkit's.
    set(OB_CUBLAS_LIBRARY "" CACHE FILEPATH "cuBLAS for ob's weight-gradient products (default: the toolkit's)")
    set(OB_CUBLASLT_LIBRARY "" CACHE FILEPATH "cuBLASLt for ob's MLP products (default: the toolkit's)")
    set(OB_CUBLAS_LINK CUDA::cublas)
    if(OB_CUBLAS_LIBRARY)
      set(OB_CUBLAS_LINK ${OB_CUBLAS_LIBRARY})
    endif()
    if(OB_CUBLASLT_LIBRARY)
      list(APPEND OB_CUBLAS_LINK ${OB_CUBLASLT_LIBRARY})
    else()
      list(APPEND OB_CUBLAS_LINK CUDA::cublasLt)
    endif()
    message(STATUS "ob: CUDA kernels built with ${CMAKE_CUDA_COMPILER}")
  else()
    message(STATUS "ob: no CUDA compiler: the loss runs ATen's kernels")
  endif()
else()
  set(OB_NCCL_VERSION "")
  message(STATUS "ob: CPU only (LibTorch without CUDA)")
endif()
