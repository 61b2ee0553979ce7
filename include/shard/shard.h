/* shard.h — umbrella header of libshard. */
#ifndef SHARD_H
#define SHARD_H

#include "shard/checkpoint.h"
#include "shard/comm.h"
#include "shard/dtensor.h"
#include "shard/dtype.h"
#include "shard/launch.h"
#include "shard/memory.h"
#include "shard/mesh.h"
#include "shard/redistribute.h"
#include "shard/safetensors.h"
#include "shard/spec.h"
#include "shard/status.h"
#include "shard/tensor.h"

#define SHARD_VERSION_STRING "0.1.0"

#endif
