package replica_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rlhub/rlhub/internal/auth"
	"github.com/rlhub/rlhub/internal/replica"
	"github.com/rlhub/rlhub/internal/testkit"
)

// With tokens on, a standby answers the position query (which decides
// who serves a term) only with the token the replication stream needs on
// the primary (admin); without tokens it answers anyone, as before.
func TestStandbyPositionQueryNeedsTheReplicationToken(t *testing.T) {
	const admin, trainer = "rlh_admin-token", "rlh_trainer-token"
	v := auth.NewVerifier(map[string]auth.Principal{
		auth.Hash(admin):   {Name: "replica", Role: auth.Admin, Scopes: []string{""}},
		auth.Hash(trainer): {Name: "learner", Role: auth.Trainer, Scopes: []string{""}},
	})
	for _, tc := range []struct {
		name  string
		guard *auth.Verifier
		token string
		want  codes.Code
	}{
		{"tokens on, admin", v, admin, codes.OK},
		{"tokens on, no token", v, "", codes.Unauthenticated},
		{"tokens on, unknown token", v, "rlh_nobody", codes.Unauthenticated},
		{"tokens on, trainer", v, trainer, codes.PermissionDenied},
		{"tokens off, no token", nil, "", codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis := testkit.Listen(t)
			stop := replica.StartStandbyForTest(lis, tc.guard, 7, 42)
			defer func() {
				if err := stop(); err != nil {
					t.Error(err)
				}
			}()
			cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, auth.TokenHeader, "Bearer "+tc.token)
			}
			epoch, unit, err := replica.QueryPositionForTest(ctx, cc)
			if got := status.Code(err); got != tc.want {
				t.Fatalf("position query: %v (code %v), want %v", err, got, tc.want)
			}
			if tc.want == codes.OK && (epoch != 7 || unit != 42) {
				t.Errorf("position = epoch %d unit %d, want 7 and 42", epoch, unit)
			}
		})
	}
}
