# `pip install .` (pyproject.toml, scikit-build-core): the Python module for the interpreter that
# runs pip, against that interpreter's torch, configured as scripts/setup_torch2.sh configures
# build-torch2/ by hand: LibTorch from torch.utils.cmake_prefix_path, and for a CUDA torch from
# PyPI the toolkit folder, nvcc and NCCL from its nvidia-* wheels (scripts/lib/cuda_from_wheels.sh).
# Included by the top CMakeLists.txt before find_package(Torch) when SKBUILD is set.
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c "import sysconfig, torch.utils; print(torch.utils.cmake_prefix_path); print(sysconfig.get_paths()['purelib'])"
  OUTPUT_VARIABLE gasloc_pip_paths OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE gasloc_pip_rc ERROR_VARIABLE gasloc_pip_err)
if(NOT gasloc_pip_rc EQUAL 0)
  message(FATAL_ERROR "pip install .: ${Python3_EXECUTABLE} cannot import torch (${gasloc_pip_err}): install torch into "
                      "this environment first (pip install -r requirements/torch2.txt), then pip install . --no-build-isolation")
endif()
string(REPLACE "\n" ";" gasloc_pip_paths "${gasloc_pip_paths}")
list(GET gasloc_pip_paths 0 gasloc_torch_prefix)
list(GET gasloc_pip_paths 1 gasloc_site)
list(APPEND CMAKE_PREFIX_PATH ${gasloc_torch_prefix})

execute_process(
  COMMAND bash -c "source \"$0\" && cuda_from_wheels \"$1\" \"$2\"" ${CMAKE_SOURCE_DIR}/scripts/lib/cuda_from_wheels.sh
          ${gasloc_site} ${CMAKE_BINARY_DIR}/cuda
  OUTPUT_VARIABLE gasloc_cuda OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE gasloc_cuda_rc)
if(gasloc_cuda_rc EQUAL 0)
  # No GPU needed to build: the architecture is named (Hopper unless TORCH_CUDA_ARCH_LIST says), as setup_torch2.sh.
  if(DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(gasloc_arch $ENV{TORCH_CUDA_ARCH_LIST})
  else()
    set(gasloc_arch 9.0)
  endif()
  string(REPLACE "." "" gasloc_cuda_arch "${gasloc_arch}")
  set(CUDA_TOOLKIT_ROOT_DIR ${gasloc_cuda} CACHE PATH "the CUDA toolkit folder laid out from the nvidia-* wheels")
  set(CUDAToolkit_ROOT ${gasloc_cuda} CACHE PATH "")
  set(CMAKE_CUDA_COMPILER ${gasloc_cuda}/bin/nvcc CACHE FILEPATH "")
  set(TORCH_CUDA_ARCH_LIST ${gasloc_arch} CACHE STRING "")
  set(CMAKE_CUDA_ARCHITECTURES ${gasloc_cuda_arch} CACHE STRING "")
  set(NCCL_INCLUDE_DIR ${gasloc_site}/nvidia/nccl/include CACHE PATH "")
  set(NCCL_LIBRARY ${gasloc_site}/nvidia/nccl/lib/libnccl.so.2 CACHE FILEPATH "")
  message(STATUS "pip install .: torch in ${gasloc_site}, CUDA from its wheels (${gasloc_cuda}, arch ${gasloc_arch})")
else()
  message(STATUS "pip install .: torch in ${gasloc_site} (no CUDA wheels with nvcc beside it)")
endif()
