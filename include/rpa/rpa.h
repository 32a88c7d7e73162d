// Everything of rpa's public API in one include.
#ifndef RPA_RPA_H_
#define RPA_RPA_H_

#include "rpa/attention.h"
#include "rpa/dtype.h"
#include "rpa/engine_page_tables.h"
#include "rpa/error.h"
#include "rpa/kernels.h"
#include "rpa/kv_cache.h"
#include "rpa/merge.h"
#include "rpa/mla.h"
#include "rpa/options.h"
#include "rpa/page_table.h"
#include "rpa/plan.h"
#include "rpa/reference.h"
#include "rpa/tensor.h"
#include "rpa/threads.h"
#include "rpa/validate.h"

#endif  // RPA_RPA_H_
