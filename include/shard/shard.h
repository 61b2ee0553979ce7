/* shard.h — umbrella header of libshard. */
#ifndef SHARD_H
#define SHARD_H

#include "shard/blas.h"
#include "shard/checkpoint.h"
#include "shard/cnn.h"
#include "shard/comm.h"
#include "shard/data.h"
#include "shard/dtensor.h"
#include "shard/dtype.h"
#include "shard/engine.h"
#include "shard/gpt.h"
#include "shard/launch.h"
#include "shard/layers.h"
#include "shard/memory.h"
#include "shard/mesh.h"
#include "shard/model.h"
#include "shard/optim.h"
#include "shard/params.h"
#include "shard/redistribute.h"
#include "shard/safetensors.h"
#include "shard/spec.h"
#include "shard/split.h"
#include "shard/status.h"
#include "shard/tensor.h"
#include "shard/tp.h"
#include "shard/trainer.h"

#define SHARD_VERSION_STRING "0.1.0"

#endif
