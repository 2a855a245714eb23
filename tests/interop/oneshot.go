package main

// One-shot lock and unlock commands, each its own short-lived process, for the CLI
// start-up benchmark (benches/lockwarden/cli.rs): the same job as `lockwarden lock` +
// `lockwarden unlock` on the same server, done the way a small Go tool would.
//
//	interop s3lock-lock    --endpoint URL --bucket B --key K          prints "<id> <etag>"
//	interop s3lock-unlock  --endpoint URL --bucket B --key K --id I --etag E
//	interop dynamo-lock    --endpoint URL --table T --key K --owner O  prints "<rvn>"
//	interop dynamo-unlock  --endpoint URL --table T --key K --rvn R
//
// s3lock's protocol as in runS3Lock; DynamoDB with dynamolock's item format
// (ownerName, leaseDuration, recordVersionNumber, isReleased) by conditional writes.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/google/uuid"
)

// oneshotFlags declares and parses every one-shot command's flags; returns the AWS
// client configuration and the other flags' values by name.
func oneshotFlags(fs *flag.FlagSet, args []string) (aws.Config, map[string]*string) {
	config := awsFlags(fs, "S3 or DynamoDB")
	v := map[string]*string{}
	for _, f := range []string{"bucket", "key", "id", "etag", "table", "owner", "rvn"} {
		v[f] = fs.String(f, "", f)
	}
	_ = fs.Parse(args)
	return config(), v
}

func runS3LockOnce(fs *flag.FlagSet, args []string, unlock bool) {
	config, v := oneshotFlags(fs, args)
	client := s3.NewFromConfig(config, func(o *s3.Options) { o.UsePathStyle = true })
	ctx := context.Background()
	if !unlock {
		id := uuid.NewString()
		put, err := client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: v["bucket"], Key: v["key"], Body: strings.NewReader(id), IfNoneMatch: aws.String("*"),
		})
		if err != nil {
			fail(err)
		}
		fmt.Printf("%s %s\n", id, aws.ToString(put.ETag))
		return
	}
	got, err := client.GetObject(ctx, &s3.GetObjectInput{Bucket: v["bucket"], Key: v["key"], IfMatch: v["etag"]})
	if err != nil {
		fail(err)
	}
	body, err := io.ReadAll(got.Body)
	got.Body.Close()
	if err != nil {
		fail(err)
	}
	if string(body) != *v["id"] {
		fail(fmt.Errorf("lock mismatch: body %q", body))
	}
	if _, err := client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: v["bucket"], Key: v["key"], IfMatch: v["etag"]}); err != nil {
		fail(err)
	}
}

func runDynamoOnce(fs *flag.FlagSet, args []string, unlock bool) {
	config, v := oneshotFlags(fs, args)
	client := dynamodb.NewFromConfig(config)
	ctx := context.Background()
	key := map[string]types.AttributeValue{"key": &types.AttributeValueMemberS{Value: *v["key"]}}
	if !unlock {
		rvn := uuid.NewString()
		item := map[string]types.AttributeValue{
			"key":                 key["key"],
			"ownerName":           &types.AttributeValueMemberS{Value: *v["owner"]},
			"leaseDuration":       &types.AttributeValueMemberS{Value: "30s"},
			"recordVersionNumber": &types.AttributeValueMemberS{Value: rvn},
		}
		_, err := client.PutItem(ctx, &dynamodb.PutItemInput{
			TableName:           v["table"],
			Item:                item,
			ConditionExpression: aws.String("attribute_not_exists(#k) OR attribute_exists(#r)"),
			ExpressionAttributeNames: map[string]string{
				"#k": "key", "#r": "isReleased",
			},
		})
		var held *types.ConditionalCheckFailedException
		if errors.As(err, &held) {
			fmt.Fprintln(os.Stderr, "lock already held")
			os.Exit(3)
		}
		if err != nil {
			fail(err)
		}
		fmt.Println(rvn)
		return
	}
	_, err := client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 v["table"],
		Key:                       key,
		UpdateExpression:          aws.String("SET #r = :one"),
		ConditionExpression:       aws.String("#v = :rvn"),
		ExpressionAttributeNames:  map[string]string{"#r": "isReleased", "#v": "recordVersionNumber"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": &types.AttributeValueMemberS{Value: "1"}, ":rvn": &types.AttributeValueMemberS{Value: *v["rvn"]}},
	})
	if err != nil {
		fail(err)
	}
}
