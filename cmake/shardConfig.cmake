# shardConfig.cmake — what find_package(shard) reads from an installed shard: the imported targets
#   shard::shard         libshard.so, which carries its own dependencies
#   shard::shard_static  libshard.a, with the libraries it needs linked after it
# Both give the include directory of <shard/shard.h>. The public headers include no third-party header,
# so no dependency has to be found here.
include(${CMAKE_CURRENT_LIST_DIR}/shardTargets.cmake)
