package auth

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	_ "google.golang.org/protobuf/types/known/emptypb" // a header type the table names (Replica/Follow)
)

// Rule is one line of the policy: who may call a method and which model
// the call touches.
type Rule struct {
	// Method is the gRPC full method ("/rlhub.v1.ModelStore/Push") or the
	// data-plane method ("rlhub.v1.Reducer/Push", Plane DataPlane).
	Method string
	// Plane is where the method is served.
	Plane Plane
	// Role is the least role that may call it.
	Role Role
	// Model is where the model name comes from.
	Model Source
	// Header is the data-plane header message's full name (DataPlane only).
	Header protoreflect.FullName
}

// Plane is where a method is served.
type Plane int

const (
	GRPC Plane = iota
	DataPlane
)

// SourceKind is how a Source finds the model a call touches.
type SourceKind int

const (
	// NoModel: the method touches no one model (role check only).
	NoModel SourceKind = iota
	// Field: the model name is a field of the request (for streams, of
	// the first message; for the data plane, of the header); a path
	// through repeated fields yields every element's name, all checked.
	Field
	// RunID: the field is an ARS run id; the model is Prefix + id.
	RunID
	// Namespace: the call touches every model under Prefix ("" is every
	// model): the token must cover all of them.
	Namespace
	// Filtered: the call names no model; its handler answers only with
	// models under Prefix the token covers (an ARS lease hands out tasks
	// of the runs the token's scopes cover, and of no other).
	Filtered
)

// Source says where a call's model name comes from.
type Source struct {
	Kind   SourceKind
	Path   string // Field, RunID: dotted field names from the request
	Prefix string // RunID, Namespace
}

// The sources the table uses.
func none() Source                  { return Source{} }
func field(path string) Source      { return Source{Kind: Field, Path: path} }
func namespace(p string) Source     { return Source{Kind: Namespace, Prefix: p} }
func filtered(p string) Source      { return Source{Kind: Filtered, Prefix: p} }
func arsRun(path string) Source     { return Source{Kind: RunID, Path: path, Prefix: ARSModelPrefix} }
func (s Source) needsMessage() bool { return s.Kind == Field || s.Kind == RunID }

// ARSModelPrefix is the prefix of every ARS run's model ("ars/" + run id,
// internal/arsrpc).
const ARSModelPrefix = "ars/"

// String renders the source for the docs.
func (s Source) String() string {
	switch s.Kind {
	case Field:
		return "`" + s.Path + "`"
	case RunID:
		return "`" + s.Prefix + "` + `" + s.Path + "`"
	case Namespace:
		if s.Prefix == "" {
			return "every model (unscoped token)"
		}
		return "every model under `" + s.Prefix + "`"
	case Filtered:
		return "answers only with models under `" + s.Prefix + "` the token covers"
	}
	return "—"
}

// Models returns the model names msg names under s (Field, RunID). An
// unset or empty name is returned as "" (every model).
func (s Source) Models(msg proto.Message) []string {
	switch s.Kind {
	case Namespace:
		return []string{s.Prefix}
	case Field, RunID:
	default:
		return nil
	}
	var out []string
	walk(msg.ProtoReflect(), strings.Split(s.Path, "."), &out)
	if len(out) == 0 {
		out = []string{""}
	}
	if s.Kind == RunID {
		for i, id := range out {
			if id == "" {
				continue // every run
			}
			out[i] = s.Prefix + id
		}
	}
	return out
}

func walk(m protoreflect.Message, path []string, out *[]string) {
	fd := m.Descriptor().Fields().ByName(protoreflect.Name(path[0]))
	if fd == nil {
		panic(fmt.Sprintf("auth: policy path: %s has no field %q", m.Descriptor().FullName(), path[0]))
	}
	switch {
	case fd.IsList():
		l := m.Get(fd).List()
		for i := range l.Len() {
			if len(path) == 1 {
				*out = append(*out, l.Get(i).String())
			} else {
				walk(l.Get(i).Message(), path[1:], out)
			}
		}
		if l.Len() == 0 {
			*out = append(*out, "")
		}
	case len(path) == 1:
		*out = append(*out, m.Get(fd).String())
	default:
		walk(m.Get(fd).Message(), path[1:], out)
	}
}

// Policy is the table: every method a hub serves on either plane. A
// method missing from it is refused (PermissionDenied) when tokens are on;
// a test walks the hub's registered services and fails on a missing one.
var Policy = []Rule{
	// Health checks are public (load balancers, `rlhub ping`); reflection
	// shows the schema, not data.
	{Method: "/grpc.health.v1.Health/Check", Role: Public},
	{Method: "/grpc.health.v1.Health/List", Role: Public},
	{Method: "/grpc.health.v1.Health/Watch", Role: Public},
	{Method: "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", Role: Reader},
	{Method: "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Role: Reader},

	// Where the primary is: every hub answers (internal/clusterrpc).
	{Method: "/rlhub.v1.Cluster/Primary", Role: Reader},
	{Method: "/rlhub.v1.Cluster/Replication", Role: Reader},

	// Model store.
	{Method: "/rlhub.v1.ModelStore/Push", Role: Trainer, Model: field("header.blob.model")},
	{Method: "/rlhub.v1.ModelStore/Pull", Role: Reader, Model: field("model")},
	{Method: "/rlhub.v1.ModelStore/Watch", Role: Reader, Model: field("model")},
	{Method: "/rlhub.v1.ModelStore/List", Role: Reader},
	{Method: "/rlhub.v1.ModelStore/Delete", Role: Admin, Model: field("model")},

	// Gradient reducer: clients.
	{Method: "/rlhub.v1.Reducer/Register", Role: Admin, Model: field("model")},
	{Method: "/rlhub.v1.Reducer/Secondaries", Role: Reader},
	{Method: "/rlhub.v1.Reducer/Push", Role: Trainer, Model: field("header.blob.model")},
	{Method: "/rlhub.v1.Reducer/Stats", Role: Reader},
	// Gradient reducer: secondaries in other hubs. Attaching one puts its
	// address on every client's list of secondaries, which then send it
	// their gradients: linking a hub is the operator's (admin, the token
	// hubs dial each other with, as standbys do), and covers every model.
	{Method: "/rlhub.v1.ReducerPrimary/Attach", Role: Admin, Model: namespace("")},
	{Method: "/rlhub.v1.ReducerPrimary/Describe", Role: Trainer, Model: field("model")},
	{Method: "/rlhub.v1.ReducerPrimary/Admit", Role: Trainer, Model: field("model")},
	{Method: "/rlhub.v1.ReducerPrimary/Release", Role: Trainer, Model: field("model")},
	{Method: "/rlhub.v1.ReducerPrimary/Forward", Role: Trainer, Model: field("header.blob.model")},

	// Weight sync: collectors attach and report; status is reading.
	{Method: "/rlhub.v1.WeightSync/Attach", Role: Worker, Model: field("hello.model")},
	// An optimizer host computes the model's new weights: the trainer of it.
	{Method: "/rlhub.v1.OptimizerHost/Attach", Role: Trainer, Model: field("hello.model")},
	{Method: "/rlhub.v1.WeightSync/Report", Role: Worker, Model: field("reports.model")},
	{Method: "/rlhub.v1.WeightSync/Status", Role: Reader, Model: field("model")},

	// Learner aggregator: learners attach; the coordinator drives tasks.
	{Method: "/rlhub.v1.LearnerAggregator/Attach", Role: Worker},
	{Method: "/rlhub.v1.LearnerAggregator/Resources", Role: Reader},
	{Method: "/rlhub.v1.LearnerAggregator/Start", Role: Trainer},
	{Method: "/rlhub.v1.LearnerAggregator/GetDataDemand", Role: Trainer},
	{Method: "/rlhub.v1.LearnerAggregator/Learn", Role: Trainer},
	{Method: "/rlhub.v1.LearnerAggregator/Status", Role: Reader},

	// ARS: runs are started and stopped by an admin; workers lease the
	// tasks of the runs their token covers and report to the run they
	// leased; a worker id answers only to the token that attached it.
	{Method: "/rlhub.v1.ARS/StartRun", Role: Admin, Model: namespace(ARSModelPrefix)},
	{Method: "/rlhub.v1.ARS/WatchRun", Role: Reader, Model: arsRun("run_id")},
	{Method: "/rlhub.v1.ARS/StopRun", Role: Admin, Model: arsRun("run_id")},
	{Method: "/rlhub.v1.ARS/Attach", Role: Worker},
	{Method: "/rlhub.v1.ARS/Lease", Role: Worker, Model: filtered(ARSModelPrefix)},
	{Method: "/rlhub.v1.ARS/Report", Role: Worker, Model: arsRun("run_id")},
	{Method: "/rlhub.v1.ARS/Detach", Role: Worker},
	{Method: "/rlhub.v1.ARS/PullPolicy", Role: Reader, Model: arsRun("run_id")},

	// Cluster replication (internal/replica): a standby copies the
	// primary's whole data directory, every model and run: admin only.
	{Method: "/rlhub.v1.Replica/Follow", Role: Admin},

	// Data plane (internal/wire/bulk): the model comes from the header.
	{Method: "rlhub.v1.Reducer/Push", Plane: DataPlane, Role: Trainer, Header: "rlhub.v1.ReducerPushHeader", Model: field("blob.model")},
	{Method: "rlhub.v1.ReducerPrimary/Forward", Plane: DataPlane, Role: Trainer, Header: "rlhub.v1.ReducerForwardHeader", Model: field("blob.model")},
	{Method: "rlhub.v1.ModelStore/Push", Plane: DataPlane, Role: Trainer, Header: "rlhub.v1.StorePushHeader", Model: field("blob.model")},
	{Method: "rlhub.v1.ModelStore/Pull", Plane: DataPlane, Role: Reader, Header: "rlhub.v1.StorePullRequest", Model: field("model")},
	{Method: "rlhub.v1.ModelStore/Watch", Plane: DataPlane, Role: Reader, Header: "rlhub.v1.StoreWatchRequest", Model: field("model")},
	{Method: "rlhub.v1.WeightSync/Watch", Plane: DataPlane, Role: Worker, Header: "rlhub.v1.SyncHello", Model: field("model")},
	// The replication stream on the data plane (internal/replica): as its
	// gRPC method, admin only.
	{Method: "rlhub.v1.Replica/Follow", Plane: DataPlane, Role: Admin, Header: "google.protobuf.Empty"},
}

// Lookup finds the rule for method on plane.
func Lookup(plane Plane, method string) (Rule, bool) {
	r, ok := rules[ruleKey{plane, method}]
	return r, ok
}

type ruleKey struct {
	plane  Plane
	method string
}

var rules = func() map[ruleKey]Rule {
	m := map[ruleKey]Rule{}
	for _, r := range Policy {
		k := ruleKey{r.Plane, r.Method}
		if _, dup := m[k]; dup {
			panic("auth: policy lists " + r.Method + " twice")
		}
		m[k] = r
	}
	return m
}()

// Markdown renders Policy as the table in docs/security.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString("| plane | method | least role | model checked against the token's scopes |\n")
	b.WriteString("| --- | --- | --- | --- |\n")
	for _, r := range Policy {
		plane := "gRPC"
		if r.Plane == DataPlane {
			plane = "data plane"
		}
		model := r.Model.String()
		if r.Plane == DataPlane && r.Model.Kind == Field {
			model = "`" + string(r.Header) + "." + r.Model.Path + "`"
		}
		role := r.Role.String()
		if r.Role == Public {
			role = "none (no token needed)"
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", plane, r.Method, role, model)
	}
	return b.String()
}
