# DTRAIN_PYTHON: the Python the tests and benchmarks run -- their scripts, the independent readers
# they check dtrain's files with, and the PyTorch peers they compare dtrain with. By default the
# project's environment (.venv, which scripts/setup.sh makes from scripts/requirements.txt), else
# the python3 on PATH; -DDTRAIN_PYTHON=/path/to/python3 chooses another. Tests reach it through
# tests/support (python()), benchmarks through their DTRAIN_PYTHON macro (their --python default),
# CTest's Python tests as their command.
set(_dtrain_python_default "${CMAKE_SOURCE_DIR}/.venv/bin/python3")
if(NOT EXISTS "${_dtrain_python_default}")
  find_program(_dtrain_python_on_path python3 NO_CACHE)
  set(_dtrain_python_default "${_dtrain_python_on_path}")
endif()
# A value nobody chose follows the default, so that a .venv made after the first configure is
# taken at the next one.
if(NOT DEFINED DTRAIN_PYTHON OR DTRAIN_PYTHON STREQUAL _DTRAIN_PYTHON_DEFAULT)
  set(DTRAIN_PYTHON "${_dtrain_python_default}" CACHE FILEPATH
      "Python of the tests and benchmarks (default: the project's .venv, else python3 on PATH)"
      FORCE)
endif()
set(_DTRAIN_PYTHON_DEFAULT "${_dtrain_python_default}" CACHE INTERNAL "")

# The torch it has, from its package metadata: importing torch would take seconds.
set(_dtrain_python_torch "")
if(DTRAIN_PYTHON)
  execute_process(
    COMMAND "${DTRAIN_PYTHON}" -c "import importlib.metadata as m; print(m.version('torch'))"
    OUTPUT_VARIABLE _dtrain_python_torch OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
if(_dtrain_python_torch)
  message(STATUS
          "Python of the tests and benchmarks: ${DTRAIN_PYTHON} (torch ${_dtrain_python_torch})")
elseif(DTRAIN_PYTHON)
  message(STATUS "Python of the tests and benchmarks: ${DTRAIN_PYTHON} (no torch: the tests "
                 "that need it fail; HINT: scripts/setup.sh makes .venv)")
else()
  message(WARNING "no Python found for the tests and benchmarks (no .venv, no python3 on PATH): "
                  "the tests that run Python fail. HINT: scripts/setup.sh makes .venv, or set "
                  "-DDTRAIN_PYTHON=/path/to/python3")
endif()
