package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

const poolUsage = "pool [show] | set IMAGE:PRESET=N... | reset"

func cmdPool(ctx context.Context, c *cli, args []string) (int, error) {
	if slices.ContainsFunc(args, isHelp) && helpOnly(c, poolUsage, []string{"--help"}) {
		return 0, flag.ErrHelp
	}
	var out json.RawMessage
	switch {
	case len(args) == 0 || (len(args) == 1 && args[0] == "show"):
		if err := c.c.Do(ctx, "GET", "/v1/pool", nil, nil, &out); err != nil {
			return 0, err
		}
	case len(args) >= 1 && args[0] == "set":
		pool := map[string]int{}
		for _, a := range args[1:] {
			for part := range strings.SplitSeq(a, ",") {
				k, v, ok := strings.Cut(part, "=")
				n, err := strconv.Atoi(v)
				if !ok || err != nil || k == "" {
					return 2, fmt.Errorf("harebox pool set: %q: want IMAGE:PRESET=N (e.g. default:small=2)", part)
				}
				pool[k] = n
			}
		}
		if err := c.c.Do(ctx, "PUT", "/v1/pool", nil, map[string]any{"pool": pool}, &out); err != nil {
			return 0, err
		}
	case len(args) == 1 && args[0] == "reset":
		if err := c.c.Do(ctx, "DELETE", "/v1/pool", nil, nil, &out); err != nil {
			return 0, err
		}
	default:
		return 2, errors.New("usage: harebox " + poolUsage)
	}
	return 0, c.json(out)
}
