# Locates cuDNN 9 and the cuDNN frontend headers for fusedattn.
#
# cuDNN comes from, in order: FUSEDATTN_CUDNN_ROOT, the nvidia-cudnn-cu13 Python package (the
# copy PyTorch and JAX load, so headers and library agree with theirs), then the CUDA toolkit.
# The package ships libcudnn.so.9 but no unversioned libcudnn.so, so we link the file itself.

set(FUSEDATTN_CUDNN_ROOT "" CACHE PATH "Folder with include/cudnn.h and lib/libcudnn.so.9")

function(_fusedattn_python_cudnn_root out)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(NOT Python3_Interpreter_FOUND)
    return()
  endif()
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util as u; s = u.find_spec('nvidia.cudnn'); print(list(s.submodule_search_locations)[0] if s else '')"
    OUTPUT_VARIABLE root OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(root AND EXISTS "${root}/include/cudnn.h")
    set(${out} "${root}" PARENT_SCOPE)
  endif()
endfunction()

set(_cudnn_roots "")
if(FUSEDATTN_CUDNN_ROOT)
  list(APPEND _cudnn_roots "${FUSEDATTN_CUDNN_ROOT}")
endif()
_fusedattn_python_cudnn_root(_python_cudnn)
if(_python_cudnn)
  list(APPEND _cudnn_roots "${_python_cudnn}")
endif()
list(APPEND _cudnn_roots "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}")

set(CUDNN_INCLUDE_DIR "")
set(CUDNN_LIBRARY "")
foreach(root IN LISTS _cudnn_roots)
  if(EXISTS "${root}/include/cudnn.h")
    foreach(libdir lib lib64)
      foreach(name libcudnn.so.9 libcudnn.so)
        if(NOT CUDNN_LIBRARY AND EXISTS "${root}/${libdir}/${name}")
          set(CUDNN_INCLUDE_DIR "${root}/include")
          set(CUDNN_LIBRARY "${root}/${libdir}/${name}")
        endif()
      endforeach()
    endforeach()
  endif()
endforeach()
if(NOT CUDNN_LIBRARY)
  message(FATAL_ERROR
    "fusedattn: cuDNN 9 not found. Looked in: ${_cudnn_roots}. Install the nvidia-cudnn-cu13 "
    "Python package or set -DFUSEDATTN_CUDNN_ROOT=<folder with include/cudnn.h and lib/libcudnn.so.9>.")
endif()
file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _v REGEX "define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*" "\\1" CUDNN_VERSION_MAJOR "${_v}")
string(REGEX REPLACE ".*CUDNN_MINOR ([0-9]+).*" "\\1" CUDNN_VERSION_MINOR "${_v}")
string(REGEX REPLACE ".*CUDNN_PATCHLEVEL ([0-9]+).*" "\\1" CUDNN_VERSION_PATCH "${_v}")
if(NOT CUDNN_VERSION_MAJOR EQUAL 9)
  message(FATAL_ERROR "fusedattn: needs cuDNN 9, found ${CUDNN_VERSION_MAJOR}.${CUDNN_VERSION_MINOR} in ${CUDNN_INCLUDE_DIR}")
endif()
get_filename_component(CUDNN_LIBRARY_DIR "${CUDNN_LIBRARY}" DIRECTORY)
message(STATUS "fusedattn: cuDNN ${CUDNN_VERSION_MAJOR}.${CUDNN_VERSION_MINOR}.${CUDNN_VERSION_PATCH}: ${CUDNN_INCLUDE_DIR}, ${CUDNN_LIBRARY}")

# The frontend is header-only, pinned, and installed by scripts/setup.sh into .deps/.
set(FUSEDATTN_FRONTEND_VERSION "1.32.0")
# `pip install .` builds in an environment that has the package (a build requirement in
# pyproject.toml), whose headers sit beside its `cudnn` package; that is the second place looked in.
set(_fe_default "${PROJECT_SOURCE_DIR}/.deps/cudnn_frontend/include")
if(NOT EXISTS "${_fe_default}/cudnn_frontend.h" AND DEFINED SKBUILD)
  find_package(Python COMPONENTS Interpreter REQUIRED)
  # The wheel puts include/ beside its Python package `cudnn`; found without importing it.
  execute_process(COMMAND "${Python_EXECUTABLE}" -c
                    "import importlib.util as u, os; s = u.find_spec('cudnn'); print(os.path.dirname(list(s.submodule_search_locations)[0]) if s else '')"
                  OUTPUT_VARIABLE _fe_site OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(_fe_default "${_fe_site}/include")
endif()
set(FUSEDATTN_FRONTEND_INCLUDE "${_fe_default}" CACHE PATH "cuDNN frontend headers (folder holding cudnn_frontend.h)")
if(NOT EXISTS "${FUSEDATTN_FRONTEND_INCLUDE}/cudnn_frontend.h")
  message(FATAL_ERROR
    "fusedattn: the cuDNN frontend headers are missing: no cudnn_frontend.h in ${FUSEDATTN_FRONTEND_INCLUDE}. "
    "They come from the PyPI package nvidia-cudnn-frontend==${FUSEDATTN_FRONTEND_VERSION}; run scripts/setup.sh "
    "(or pass -DFUSEDATTN_FRONTEND_INCLUDE=<folder>).")
endif()
file(STRINGS "${FUSEDATTN_FRONTEND_INCLUDE}/cudnn_frontend_version.h" _fv REGEX "define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*" "\\1" _fe_major "${_fv}")
string(REGEX REPLACE ".*MINOR_VERSION ([0-9]+).*" "\\1" _fe_minor "${_fv}")
string(REGEX REPLACE ".*PATCH_VERSION ([0-9]+).*" "\\1" _fe_patch "${_fv}")
if(NOT "${_fe_major}.${_fe_minor}.${_fe_patch}" STREQUAL FUSEDATTN_FRONTEND_VERSION)
  message(FATAL_ERROR "fusedattn: cuDNN frontend ${_fe_major}.${_fe_minor}.${_fe_patch} found in "
    "${FUSEDATTN_FRONTEND_INCLUDE}, but ${FUSEDATTN_FRONTEND_VERSION} is pinned; run scripts/setup.sh.")
endif()
