# The Debian packages (cmake/package.cmake): built with cpack, their fields, apt-get install
# --simulate, unpacked into a temporary root that runs a job and builds the consumer.
add_test(NAME package.deb
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/scripts/deb_package_test.sh
                 ${CMAKE_BINARY_DIR} ${CMAKE_CURRENT_SOURCE_DIR})
set_tests_properties(package.deb PROPERTIES LABELS integration TIMEOUT 300)
