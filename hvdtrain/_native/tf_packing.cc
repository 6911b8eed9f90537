// hvdtrain._tf_packing: three TensorFlow ops, the Keras adapter's counterpart of
// packing.c (hvdtrain/adapters/keras/tally.py loads them; without them the adapter
// uses Horovod's grouped allreduce and reads the averaged gradients once more).
//
// HvdtrainPackWithTally copies float32 or float64 gradients into one buffer and sums
// their squares in the same pass, so the non-finite check's bound costs no second read
// of the gradients. HvdtrainUnpackChecked hands the reduced gradients back as views of that
// buffer and, when the reduced bound is not finite, reads them to decide, failing with
// hvdtrain's message. Each gradient starts at a multiple of kAlign elements (the gap
// is zeros), so every view is as aligned as TensorFlow's own buffers.
// HvdtrainRequireFinite is the check of gradients that do not travel in that buffer
// (fp16 or bf16 on the wire, mixed dtypes): the same message, as a graph assertion
// would give it but unescaped.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"

namespace hvdtrain {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace shape_inference = ::tensorflow::shape_inference;

constexpr int64_t kAlign = 16;  // elements: 64 bytes or more, TensorFlow's alignment
// The tally's layout is hvdtrain.tally's (TALLY, COUNT, BOUND); setup.py defines it.
#if !defined(HVDTRAIN_TALLY) || !defined(HVDTRAIN_TALLY_COUNT) || !defined(HVDTRAIN_TALLY_BOUND)
#error "build through setup.py, which defines the tally's layout from hvdtrain/tally.py"
#endif
constexpr int64_t kTally = HVDTRAIN_TALLY;
constexpr int64_t kCount = HVDTRAIN_TALLY_COUNT;  // the rank's 1
constexpr int64_t kBound = HVDTRAIN_TALLY_BOUND;  // the L2 norm of its gradients
constexpr int kLanes = 16;      // independent partial sums: lets the compiler vectorise

int64_t Aligned(int64_t count) { return (count + kAlign - 1) / kAlign * kAlign; }

template <typename T>
T CopyAndSquareSum(const T* source, T* target, int64_t count) {
  T partial[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      const T value = source[i + lane];
      target[i + lane] = value;
      partial[lane] += value * value;
    }
  }
  T total = 0;
  for (; i < count; ++i) {
    target[i] = source[i];
    total += source[i] * source[i];
  }
  for (int lane = 0; lane < kLanes; ++lane) total += partial[lane];
  return total;
}

REGISTER_OP("HvdtrainPackWithTally")
    .Input("gradients: N * T")
    .Output("flat: T")
    .Attr("N: int >= 1")
    .Attr("T: {float, double}")
    .Attr("bound: bool")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      int64_t size = kTally;
      for (int i = 0; i < c->num_inputs(); ++i) {
        const int64_t count = c->Value(c->NumElements(c->input(i)));
        if (count == shape_inference::InferenceContext::kUnknownDim) {
          c->set_output(0, c->Vector(shape_inference::InferenceContext::kUnknownDim));
          return absl::OkStatus();
        }
        size += Aligned(count);
      }
      c->set_output(0, c->Vector(size));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The gradients flattened into one buffer, each starting at a multiple of 16
elements (zeros between), then the tally: 1, and the L2 norm of all the gradients
(with bound) or infinity (without).
)doc");

template <typename T>
class PackWithTallyOp : public OpKernel {
 public:
  explicit PackWithTallyOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("bound", &bound_));
  }

  void Compute(OpKernelContext* context) override {
    const int inputs = context->num_inputs();
    int64_t size = kTally;
    for (int i = 0; i < inputs; ++i) size += Aligned(context->input(i).NumElements());
    Tensor* flat = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, TensorShape({size}), &flat));
    T* target = flat->flat<T>().data();
    double square_sum = 0;
    int64_t offset = 0;
    for (int i = 0; i < inputs; ++i) {
      const Tensor& gradient = context->input(i);
      const int64_t count = gradient.NumElements();
      const T* source = gradient.flat<T>().data();
      if (bound_) {
        square_sum += CopyAndSquareSum(source, target + offset, count);
      } else if (count > 0) {
        std::memcpy(target + offset, source, count * sizeof(T));
      }
      std::memset(target + offset + count, 0, (Aligned(count) - count) * sizeof(T));
      offset += Aligned(count);
    }
    target[offset + kCount] = 1;
    // NaN and infinity stay what they are; a finite sum too large for T becomes
    // infinity, and the check then reads the gradients themselves.
    target[offset + kBound] = bound_ ? static_cast<T>(std::sqrt(square_sum))
                                : std::numeric_limits<T>::infinity();
  }

 private:
  bool bound_;
};

template <typename T>
bool AllFinite(const T* values, int64_t count) {
  // x - x is 0 for every finite x and NaN otherwise; the sum cannot overflow.
  T partial[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int lane = 0; lane < kLanes; ++lane) {
      partial[lane] += values[i + lane] - values[i + lane];
    }
  }
  T total = 0;
  for (; i < count; ++i) total += values[i] - values[i];
  for (int lane = 0; lane < kLanes; ++lane) total += partial[lane];
  return total == 0;
}

// `message` with its "{step}" replaced by the value of `step`.
std::string StepMessage(const std::string& message, const Tensor& step) {
  std::string text = message;
  const std::string placeholder = "{step}";
  const size_t at = text.find(placeholder);
  if (at != std::string::npos) {
    text.replace(at, placeholder.size(), std::to_string(step.scalar<int64_t>()()));
  }
  return text;
}

REGISTER_OP("HvdtrainUnpackChecked")
    .Input("flat: T")
    .Input("step: int64")
    .Input("limit: T")
    .Output("gradients: N * T")
    .Output("tally: T")
    .Attr("N: int >= 1")
    .Attr("T: {float, double}")
    .Attr("shapes: list(shape)")
    .Attr("check: bool")
    .Attr("messages: list(string)")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("shapes", &shapes));
      for (size_t i = 0; i < shapes.size(); ++i) {
        shape_inference::ShapeHandle shape;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[i], &shape));
        c->set_output(static_cast<int>(i), shape);
      }
      c->set_output(static_cast<int>(shapes.size()), c->Vector(kTally));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The gradients of a reduced HvdtrainPackWithTally buffer, shaped as `shapes`, and its
tally. With check: unless the tally's bound is below `limit` (which proves every
gradient finite: hvdtrain.tally.finite_bound_limit), reads the gradients and fails
with the message of the first that holds NaN or Inf (`messages`, one per gradient, its
"{step}" replaced by `step`).
)doc");

template <typename T>
class UnpackCheckedOp : public OpKernel {
 public:
  explicit UnpackCheckedOp(OpKernelConstruction* context) : OpKernel(context) {
    std::vector<PartialTensorShape> shapes;
    OP_REQUIRES_OK(context, context->GetAttr("shapes", &shapes));
    for (const PartialTensorShape& shape : shapes) {
      TensorShape full;
      OP_REQUIRES(context, shape.AsTensorShape(&full),
                  absl::InvalidArgumentError(
                      "HvdtrainUnpackChecked needs fully known shapes"));
      shapes_.push_back(full);
    }
    OP_REQUIRES_OK(context, context->GetAttr("check", &check_));
    OP_REQUIRES_OK(context, context->GetAttr("messages", &messages_));
    OP_REQUIRES(context, messages_.size() == shapes_.size(),
                absl::InvalidArgumentError(absl::StrCat(
                    "HvdtrainUnpackChecked: ", messages_.size(), " messages for ",
                    shapes_.size(), " gradients")));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& flat = context->input(0);
    int64_t size = kTally;
    for (const TensorShape& shape : shapes_) size += Aligned(shape.num_elements());
    OP_REQUIRES(context, flat.dims() == 1 && flat.NumElements() == size,
                absl::InvalidArgumentError(absl::StrCat(
                    "HvdtrainUnpackChecked: the buffer holds ", flat.NumElements(),
                    " elements, the shapes need ", size)));
    const T* values = flat.flat<T>().data();
    const int64_t end = size - kTally;
    const T limit = context->input(2).scalar<T>()();
    // NaN and infinity are never below the limit.
    if (check_ && !(std::abs(values[end + kBound]) < limit)) {
      int64_t offset = 0;
      for (size_t i = 0; i < shapes_.size(); ++i) {
        if (!AllFinite(values + offset, shapes_[i].num_elements())) {
          context->CtxFailure(
              absl::InvalidArgumentError(StepMessage(messages_[i], context->input(1))));
          return;
        }
        offset += Aligned(shapes_[i].num_elements());
      }
    }
    int64_t offset = 0;
    for (size_t i = 0; i < shapes_.size(); ++i) {
      const int64_t count = shapes_[i].num_elements();
      SetView(context, static_cast<int>(i), flat.Slice(offset, offset + count), shapes_[i]);
      offset += Aligned(count);
    }
    SetView(context, static_cast<int>(shapes_.size()), flat.Slice(end, size),
            TensorShape({kTally}));
  }

 private:
  // A view of `part` shaped as `shape`; a copy if the view would not be aligned (a
  // buffer TensorFlow did not allocate).
  static void SetView(OpKernelContext* context, int index, const Tensor& part,
                      const TensorShape& shape) {
    Tensor view;
    if (part.IsAligned() && view.CopyFrom(part, shape)) {
      context->set_output(index, view);
      return;
    }
    Tensor* copy = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(index, shape, &copy));
    if (part.NumElements() > 0) {
      std::memcpy(copy->flat<T>().data(), part.flat<T>().data(),
                  part.NumElements() * sizeof(T));
    }
  }

  std::vector<TensorShape> shapes_;
  bool check_;
  std::vector<std::string> messages_;
};

REGISTER_OP("HvdtrainRequireFinite")
    .Input("tensors: T")
    .Input("step: int64")
    .Output("checked: T")
    .Attr("T: list({half, bfloat16, float, double})")
    .Attr("messages: list(string)")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The tensors, unchanged (the same buffers), once each is checked to hold no NaN or
Inf; otherwise fails with the message of the first that does (`messages`, one per
tensor, its "{step}" replaced by `step`).
)doc");

template <typename T>
bool AllFiniteWidened(const T* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(static_cast<float>(values[i]))) return false;
  }
  return true;
}

class RequireFiniteOp : public OpKernel {
 public:
  explicit RequireFiniteOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("messages", &messages_));
  }

  void Compute(OpKernelContext* context) override {
    const int count = context->num_inputs() - 1;
    OP_REQUIRES(context, static_cast<int>(messages_.size()) == count,
                absl::InvalidArgumentError(absl::StrCat(
                    "HvdtrainRequireFinite: ", messages_.size(), " messages for ", count,
                    " tensors")));
    for (int i = 0; i < count; ++i) {
      const Tensor& tensor = context->input(i);
      if (!Finite(tensor)) {
        context->CtxFailure(absl::InvalidArgumentError(
            StepMessage(messages_[i], context->input(count))));
        return;
      }
    }
    for (int i = 0; i < count; ++i) context->set_output(i, context->input(i));
  }

 private:
  static bool Finite(const Tensor& tensor) {
    const int64_t n = tensor.NumElements();
    switch (tensor.dtype()) {
      case ::tensorflow::DT_FLOAT:
        return AllFinite(tensor.flat<float>().data(), n);
      case ::tensorflow::DT_DOUBLE:
        return AllFinite(tensor.flat<double>().data(), n);
      case ::tensorflow::DT_HALF:
        return AllFiniteWidened(tensor.flat<Eigen::half>().data(), n);
      default:  // DT_BFLOAT16, the last the attribute allows
        return AllFiniteWidened(tensor.flat<::tensorflow::bfloat16>().data(), n);
    }
  }

  std::vector<std::string> messages_;
};

REGISTER_KERNEL_BUILDER(Name("HvdtrainRequireFinite").Device(::tensorflow::DEVICE_CPU),
                        RequireFiniteOp);

#define HVDTRAIN_REGISTER(T)                                                 \
  REGISTER_KERNEL_BUILDER(Name("HvdtrainPackWithTally")                      \
                              .Device(::tensorflow::DEVICE_CPU)              \
                              .TypeConstraint<T>("T"),                       \
                          PackWithTallyOp<T>);                               \
  REGISTER_KERNEL_BUILDER(Name("HvdtrainUnpackChecked")                      \
                              .Device(::tensorflow::DEVICE_CPU)              \
                              .TypeConstraint<T>("T"),                       \
                          UnpackCheckedOp<T>);

HVDTRAIN_REGISTER(float)
HVDTRAIN_REGISTER(double)
#undef HVDTRAIN_REGISTER

}  // namespace hvdtrain
