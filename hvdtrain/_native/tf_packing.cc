// hvdtrain._tf_packing: two TensorFlow ops, the Keras adapter's counterpart of
// packing.c (hvdtrain/adapters/keras/tally.py loads them; without them the adapter
// uses Horovod's grouped allreduce and reads the averaged gradients once more).
//
// HvdtrainPackWithTally copies float32 or float64 gradients into one buffer and sums
// their squares in the same pass, so the non-finite check's bound costs no second read
// of the gradients. HvdtrainUnpackChecked hands the reduced gradients back as views of that
// buffer and, when the reduced bound is not finite, reads them to decide, failing with
// hvdtrain's message. Each gradient starts at a multiple of kAlign elements (the gap
// is zeros), so every view is as aligned as TensorFlow's own buffers.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hvdtrain {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace shape_inference = ::tensorflow::shape_inference;

constexpr int64_t kAlign = 16;  // elements: 64 bytes or more, TensorFlow's alignment
constexpr int64_t kTally = 2;   // 1 (the rank's count), then the L2 norm
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
    target[offset] = 1;
    // NaN and infinity stay what they are; a finite sum too large for T becomes
    // infinity, and the check then reads the gradients themselves.
    target[offset + 1] = bound_ ? static_cast<T>(std::sqrt(square_sum))
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

REGISTER_OP("HvdtrainUnpackChecked")
    .Input("flat: T")
    .Input("step: int64")
    .Output("gradients: N * T")
    .Output("tally: T")
    .Attr("N: int >= 1")
    .Attr("T: {float, double}")
    .Attr("shapes: list(shape)")
    .Attr("check: bool")
    .Attr("message: string")
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
tally. With check: when the tally's bound is not finite, fails with `message` (its
"{step}" replaced by `step`) if any gradient holds NaN or Inf.
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
    OP_REQUIRES_OK(context, context->GetAttr("message", &message_));
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
    if (check_ && !std::isfinite(values[end + 1])) {
      int64_t offset = 0;
      for (const TensorShape& shape : shapes_) {
        if (!AllFinite(values + offset, shape.num_elements())) {
          context->CtxFailure(absl::InvalidArgumentError(StepMessage(context->input(1))));
          return;
        }
        offset += Aligned(shape.num_elements());
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

  std::string StepMessage(const Tensor& step) const {
    std::string text = message_;
    const std::string placeholder = "{step}";
    const size_t at = text.find(placeholder);
    if (at != std::string::npos) {
      text.replace(at, placeholder.size(), std::to_string(step.scalar<int64_t>()()));
    }
    return text;
  }

  std::vector<TensorShape> shapes_;
  bool check_;
  std::string message_;
};

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
