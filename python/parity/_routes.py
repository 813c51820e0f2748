"""A mixture-of-experts routing record (Routes), the reading of one to replay (route_ids) and
the sparse layers of a config (sparse_layers), shared by the scorer (model.py), the sampler and
the torch learner."""
from array import array

from . import _lib
from ._convert import numpy_array
from ._lib import ParityError


class Routes:
    """A mixture-of-experts routing record: the experts each position ran in each sparse layer,
    shape (positions, sparse layers, k), the k in slot order (descending weight, ties to the
    lower index). Sampler.routes(), Completion.routes and Model.score(return_routes=True) give
    one per sequence, covering the positions whose next token is scored (a sequence's length
    - 1, as vLLM's routed_experts: int16 [seq_len - 1, num_moe_layers, top_k]); Model.score
    (routes=...) and CausalLM.forward(routes=...) replay it.

    Attributes: data, the ids flat in (position, layer, slot) order (array('H')); layers; k.
    len() is the positions; r[j] is position j's [layers][k] lists; tolist() nests them all;
    numpy() is the (positions, layers, k) numpy array (int16 by default, as vLLM returns it).
    Two records are equal when their shapes and ids are."""

    __slots__ = ("data", "layers", "k")

    def __init__(self, data, layers, k):
        self.data = data if isinstance(data, array) and data.typecode == "H" else array("H", data)
        self.layers, self.k = layers, k
        if layers * k == 0 or len(self.data) % (layers * k):
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "a routing record of %d ids is not a "
                              "whole number of positions of %d layers x %d experts"
                              % (len(self.data), layers, k))

    @property
    def stride(self):
        """The ids of one position: layers x k."""
        return self.layers * self.k

    @property
    def shape(self):
        return (len(self), self.layers, self.k)

    def __len__(self):
        return len(self.data) // self.stride

    def __getitem__(self, j):
        if isinstance(j, slice):
            lo, hi, step = j.indices(len(self))
            if step != 1:
                raise ValueError("a routing record slices with step 1")
            return Routes(self.data[lo * self.stride:hi * self.stride], self.layers, self.k)
        n = len(self)
        if not -n <= j < n:
            raise IndexError("position %d of a record of %d positions" % (j, n))
        at = (j % n) * self.stride
        row = self.data[at:at + self.stride].tolist()
        return [row[i:i + self.k] for i in range(0, self.stride, self.k)]

    def tolist(self):
        """[positions][layers][k] nested lists of ints."""
        return [self[j] for j in range(len(self))]

    def numpy(self, dtype="int16"):
        """A numpy array of shape (positions, layers, k) (needs numpy)."""
        import numpy as np
        return np.frombuffer(self.data, dtype=np.uint16).reshape(self.shape).astype(dtype)

    def __eq__(self, other):
        return isinstance(other, Routes) and self.shape == other.shape and self.data == other.data

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __repr__(self):
        return "Routes(positions=%d, layers=%d, k=%d)" % self.shape


def sparse_layers(config):
    """The indices of a config's sparse layers ((i + 1) % decoder_sparse_step == 0 and i not in
    mlp_only_layers, a list of indices), in order; [] for a model without experts."""
    if not config.get("num_experts"):
        return []
    only = set(config["mlp_only_layers"])
    return [i for i in range(config["num_hidden_layers"])
            if (i + 1) % config["decoder_sparse_step"] == 0 and i not in only]


def route_ids(record, length, layers, k, what):
    """One sequence's routing record to replay as array('H') of length x layers x k ids (the
    last position padded with zeros, which the scorer does not read): a Routes, a numpy
    integer array or nested lists of shape (positions, layers, k) or (positions, layers x k),
    or a flat sequence of ints, with positions = length - 1 or length."""
    stride = layers * k
    if isinstance(record, Routes):
        if (record.layers, record.k) != (layers, k):
            raise ParityError(_lib.ERR_INVALID_ARGUMENT, "%s: a record of %d layers x %d experts; "
                              "this model routes %d x %d" % (what, record.layers, record.k,
                                                              layers, k))
        ids = array("H", record.data)
    else:
        a = numpy_array(record)
        if a is not None:
            if a.dtype.kind not in "iu":
                raise TypeError("%s must hold integer expert ids, not %s" % (what, a.dtype))
            flat = a.reshape(-1)
            if flat.size and (int(flat.min()) < 0 or int(flat.max()) > 2 ** 16 - 1):
                raise ParityError(_lib.ERR_INVALID_ARGUMENT, "%s: an expert id is outside "
                                  "[0, 65535]" % what)
            ids = array("H")
            ids.frombytes(flat.astype("uint16").tobytes())
        else:
            flat, stack = [], [record]
            while stack:  # nested lists flattened in order
                x = stack.pop()
                if isinstance(x, (list, tuple)):
                    stack.extend(reversed(x))
                else:
                    flat.append(_lib.as_int(x, "%s: an expert id" % what, 0, 2 ** 16 - 1))
            ids = array("H", flat)
    if len(ids) == (length - 1) * stride:
        ids.extend(array("H", bytes(2 * stride)))
    if len(ids) != length * stride:
        raise ParityError(_lib.ERR_INVALID_ARGUMENT,
                          "%s holds %d expert ids; a sequence of %d tokens needs %d positions "
                          "(or %d, the last not read) of %d sparse layers x %d experts"
                          % (what, len(ids), length, length - 1, length, layers, k))
    return ids
