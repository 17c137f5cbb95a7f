# `launch`: links dtrain_base only, so it starts on a node without CUDA libraries or libtorch.
# The launcher's logic lives in dtrain_launcher (a static library) so tests can link it.
add_library(dtrain_launcher STATIC
  launcher/version.cpp
  launcher/launch_args.cpp
  launcher/launch_config.cpp
  launcher/hosts.cpp
  launcher/scheduler_env.cpp
  launcher/forwarded_env.cpp
  launcher/nccl_env.cpp
  launcher/remote/remote_command.cpp
  launcher/remote/session.cpp
  launcher/rendezvous.cpp
  launcher/coordinator.cpp
  launcher/agent.cpp
  launcher/multinode.cpp
  launcher/preflight.cpp
  launcher/worker_env.cpp
  launcher/program.cpp
  launcher/job.cpp
  launcher/supervisor/guardian.cpp
  launcher/supervisor/output.cpp
  launcher/supervisor/failure_report.cpp
  launcher/supervisor/oom.cpp
  launcher/supervisor/process_info.cpp
  launcher/supervisor/supervisor.cpp
  launcher/monitor/cgroup_memory.cpp
  launcher/monitor/cluster_keys.cpp
  launcher/monitor/command.cpp
  launcher/monitor/gpu_sampler.cpp
  launcher/monitor/job_view.cpp
  launcher/monitor/metrics_endpoint.cpp
  launcher/monitor/monitor.cpp
  launcher/monitor/monitor_options.cpp
  launcher/monitor/native_stack.cpp
  launcher/monitor/proc_files.cpp
  launcher/monitor/process_sampler.cpp
  launcher/monitor/records.cpp
  launcher/monitor/stall_detector.cpp
  launcher/monitor/watches.cpp
)
target_include_directories(dtrain_launcher PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
# dtrain_base's internal parse_int.h (one integer rule everywhere).
target_include_directories(dtrain_launcher PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/runtime/base)
target_link_libraries(dtrain_launcher PUBLIC dtrain_base
                      PRIVATE nlohmann_json::nlohmann_json dtrain_httplib ${CMAKE_DL_LIBS})
dtrain_warnings(dtrain_launcher)

add_executable(launch launcher/main.cpp)
target_link_libraries(launch PRIVATE dtrain_launcher)
dtrain_warnings(launch)
list(APPEND DTRAIN_INSTALL_TARGETS launch)
