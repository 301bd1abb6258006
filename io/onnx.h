/*
** onnx.h -- ONNX model files (onnx.proto, protobuf) read into plain C
** structures: the graph's inputs and outputs, its initializers as
** tensors, its nodes in an order where every value is made before it is
** used.  Parsing is protobuf-c's (code generated from io/onnx.proto at
** build time); everything after it -- dtypes, dims, data sizes, external
** data, names, order -- is checked here, so the Lua layer that maps nodes
** onto fuselab ops sees only well-formed models.
**
** What fuselab cannot hold is refused with FL_EUNSUPPORTED and a message
** containing "unsupported"; what is malformed is FL_EFORMAT.
*/
#ifndef FL_ONNX_H
#define FL_ONNX_H

#include "graph/tensor.h"

/* ONNX TensorProto.DataType codes (onnx.proto) used by name here. */
enum {
  ONNX_FLOAT = 1, ONNX_UINT8 = 2, ONNX_INT8 = 3, ONNX_UINT16 = 4, ONNX_INT16 = 5,
  ONNX_INT32 = 6, ONNX_INT64 = 7, ONNX_STRING = 8, ONNX_BOOL = 9, ONNX_FLOAT16 = 10,
  ONNX_DOUBLE = 11, ONNX_UINT32 = 12, ONNX_UINT64 = 13, ONNX_BFLOAT16 = 16,
  ONNX_FLOAT8E4M3FN = 17, ONNX_FLOAT8E4M3FNUZ = 18, ONNX_FLOAT8E5M2 = 19, ONNX_FLOAT8E5M2FNUZ = 20,
  ONNX_UINT4 = 21, ONNX_INT4 = 22, ONNX_FLOAT4E2M1 = 23, ONNX_FLOAT8E8M0 = 24, ONNX_UINT2 = 25,
  ONNX_INT2 = 26
};

/* The largest model file read (protobuf's own limit is 2 GiB). */
#define ONNX_MAX_FILE ((uint64_t)2 << 30)

/* "float", "int32", ... for an ONNX dtype code ("dtype 99" otherwise,
** in a static buffer: for messages only). */
const char *onnx_dtype_name(int elem);

/* A tensor read from a TensorProto.  Types fuselab holds (float32,
** float16, bfloat16, int64, bool) keep their type; the smaller integer
** types (int8..int32, uint8..uint32) are widened to int64, exactly,
** uint64 is held as its bit pattern, and elem keeps what the file said,
** so the caller decides where that is allowed. */
typedef struct onnx_tensor {
  char *name;       /* owned; "" when the proto had none */
  int elem;         /* the ONNX dtype code of the file */
  fl_tensor t;      /* one storage reference, owned */
} onnx_tensor;

/* What a value holds (its TypeProto): a tensor, a sequence of tensors, or
** an optional of either.  Maps, sparse tensors and sequences of sequences
** are refused. */
enum { ONNX_KIND_TENSOR = 0, ONNX_KIND_SEQUENCE = 1, ONNX_KIND_OPTIONAL = 2 };

/* A graph input or output as declared. */
typedef struct onnx_value {
  char *name;                       /* owned */
  int kind;                         /* ONNX_KIND_* */
  int inner;                        /* an optional's content: ONNX_KIND_TENSOR or
                                    ** ONNX_KIND_SEQUENCE, -1 when not given */
  int elem;                         /* ONNX dtype code (of the tensors a sequence
                                    ** or optional holds), 0 when not given */
  int ndim;                         /* -1 when the rank is not given (always
                                    ** for a sequence or an optional) */
  int64_t dims[FL_MAX_DIMS];        /* -1 for a symbolic or unknown dim */
  char *dim_names[FL_MAX_DIMS];     /* owned symbolic names ("N"), or NULL */
} onnx_value;

/* Attribute kinds (AttributeProto.AttributeType, the ones carried). */
typedef enum onnx_attr_kind {
  ONNX_ATTR_FLOAT = 1, ONNX_ATTR_INT = 2, ONNX_ATTR_STRING = 3, ONNX_ATTR_TENSOR = 4,
  ONNX_ATTR_GRAPH = 5, ONNX_ATTR_FLOATS = 6, ONNX_ATTR_INTS = 7, ONNX_ATTR_STRINGS = 8,
  ONNX_ATTR_TYPE = 13,              /* a TypeProto (Optional's "type") */
  ONNX_ATTR_OTHER = 99              /* sparse tensors, lists of graphs: no payload */
} onnx_attr_kind;

struct onnx_model;

typedef struct onnx_attr {
  char *name;          /* owned */
  onnx_attr_kind kind;
  int64_t i;           /* INT */
  double f;            /* FLOAT */
  char *s;             /* STRING, owned, NUL-terminated (NULs refused) */
  size_t n;            /* INTS, FLOATS, STRINGS: element count */
  int64_t *ints;       /* owned */
  double *floats;      /* owned */
  char **strings;      /* owned */
  onnx_tensor *t;      /* TENSOR, owned */
  struct onnx_model *g;  /* GRAPH: the subgraph (name, values, initializers
                         ** and nodes; no opset of its own), owned */
  onnx_value *ty;      /* TYPE: kind, inner, elem (its name ""), owned */
} onnx_attr;

typedef struct onnx_node {
  char *name;          /* owned; "" when the file had none */
  char *op_type;       /* owned */
  char *domain;        /* owned; "" for the default ai.onnx */
  int nin, nout;
  char **in;           /* owned; "" marks an omitted optional input */
  char **out;          /* owned */
  int nattr;
  onnx_attr *attr;     /* owned */
  int nimplicit;       /* the names of enclosing scopes its subgraphs read: */
  char **implicit;     /* owned; ordered as inputs (If, Loop, Scan) */
} onnx_node;

typedef struct onnx_model {
  char *name;             /* the graph's name, owned */
  char *producer;         /* producer_name (and version), owned */
  int64_t ir_version;
  int64_t opset;          /* the ai.onnx opset imported (0: none, a model of
                          ** the other domains' ops only) */
  int64_t training_opset; /* the ai.onnx.preview.training opset (0: none) */
  int64_t preview_opset;  /* the ai.onnx.preview opset (0: none) */
  int64_t ml_opset;       /* the ai.onnx.ml opset (0: none) */
  int nin, nout, ninit, nnode;
  onnx_value *in;         /* inputs that are not initializers, in order */
  onnx_value *out;
  onnx_tensor *init;      /* initializers, in file order */
  onnx_node *node;        /* topologically sorted (file order when it is) */
  int nfree;              /* a subgraph: the names of enclosing scopes it */
  char **free_names;      /* reads (owned), the model itself none */
} onnx_model;

/* The newest ai.onnx opset whose semantics the loader knows.  A newer one
** loads (its ops with this opset's semantics: later opsets mostly add
** types) and the Lua loader warns; past ONNX_ABSURD_OPSET it is a
** malformed file. */
#define ONNX_MAX_OPSET 28
#define ONNX_ABSURD_OPSET 100
/* The domain of the optimizer ops (Adagrad, Adam, Momentum, Gradient): its
** one version, 1.  Which of its ops load is the Lua loader's to say. */
#define ONNX_TRAINING_DOMAIN "ai.onnx.preview.training"
#define ONNX_MAX_TRAINING_OPSET 1
/* The domain of the ops ONNX previews before adopting them (FlexAttention):
** its one version, 1.  Which of its ops load is the Lua loader's to say. */
#define ONNX_PREVIEW_DOMAIN "ai.onnx.preview"
#define ONNX_MAX_PREVIEW_OPSET 1
/* The domain of the classical machine-learning ops (ArrayFeatureExtractor,
** Binarizer, TreeEnsemble...): versions 1 to 5.  Which of its ops load is
** the Lua loader's to say. */
#define ONNX_ML_DOMAIN "ai.onnx.ml"
#define ONNX_MAX_ML_OPSET 5

/* Release everything m owns and clear it; accepts NULL and a cleared m. */
void onnx_model_free(onnx_model *m);
void onnx_tensor_free(onnx_tensor *t);

/* Parse a whole model image of n bytes.  dir is the folder external data
** paths are resolved in (NULL: a model with external data is refused).
** On success *m owns the model (onnx_model_free); on failure *m is
** cleared and e says "onnx: <what>", naming the node, tensor or value at
** fault. */
int onnx_parse(const void *buf, size_t n, const char *dir, onnx_model *m, fl_err *e);

/* onnx_parse for a file (a regular file only), external data looked up
** beside it; messages read "<path>: onnx: ...". */
int onnx_load(const char *path, onnx_model *m, fl_err *e);

/* One serialized TensorProto (ONNX's test data input_0.pb): the image of
** n bytes or a file. */
int onnx_tensor_parse(const void *buf, size_t n, onnx_tensor *t, fl_err *e);
int onnx_tensor_load(const char *path, onnx_tensor *t, fl_err *e);

/* The most elements (tensors, sequences, ...) one file of test data may
** hold at all its levels: counted before anything is unpacked. */
#define ONNX_MAX_SEQUENCE (1 << 20)

/* A value of ONNX's test data (onnx-data.proto): a TensorProto, a
** SequenceProto of tensors or an OptionalProto of either, as the caller
** says (kind, ONNX_KIND_*: the model's declared type; the image says
** nothing of its own type).  has: an optional holds a value (a tensor
** and a sequence always do); inner: what it holds. */
typedef struct onnx_data {
  int kind, inner, has;
  size_t n;            /* tensors held: 1 for a tensor, the elements of a sequence */
  onnx_tensor *t;      /* owned */
} onnx_data;

void onnx_data_free(onnx_data *d);
int onnx_data_parse(const void *buf, size_t n, int kind, onnx_data *d, fl_err *e);
int onnx_data_load(const char *path, int kind, onnx_data *d, fl_err *e);

#endif
