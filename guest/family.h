// The shorthand of the guest library's API-family files (contexts.cc,
// memory.cc, graph_build.cc ...): each defines exported driver functions in the
// global namespace, and each names the same few things of the library - its
// runtime, the thread's current context, the guard every export runs in, the
// wire's ops and the handle helpers - without their namespaces. Said once here
// rather than in every file; only those files include it (never a header).
#pragma once

#include "guest/guard.h"
#include "guest/internal.h"
#include "ivcuda/proto.h"

using ivcuda::guest::ctx_stack;
using ivcuda::guest::current_ctx;
using ivcuda::guest::guard;
using ivcuda::guest::Runtime;
using ivcuda::guest::internal::h;
using ivcuda::guest::internal::known_event;
using ivcuda::guest::internal::known_stream;
using ivcuda::guest::internal::proc_id;
using ivcuda::guest::internal::ptsz;
using ivcuda::guest::internal::runtime;
namespace proto = ivcuda::proto;
using proto::Op;
