-- A second copy of `A meal-kit subscription service`: the same schema, values redrawn (sqltasks.transfer.redraw).
CREATE TABLE users (id INTEGER PRIMARY KEY, email VARCHAR NOT NULL, display_name VARCHAR NOT NULL, city VARCHAR NOT NULL, signed_up_on DATE NOT NULL, referred_by INTEGER REFERENCES users(id));
CREATE TABLE plans (id INTEGER PRIMARY KEY, name VARCHAR NOT NULL, meals_per_week INTEGER NOT NULL, price_per_week DECIMAL(6, 2) NOT NULL);
CREATE TABLE subscriptions (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), plan_id INTEGER NOT NULL REFERENCES plans(id), started_on DATE NOT NULL, cancelled_on DATE, status VARCHAR NOT NULL);
CREATE TABLE recipes (id INTEGER PRIMARY KEY, title VARCHAR NOT NULL, cuisine VARCHAR NOT NULL, prep_minutes INTEGER NOT NULL, calories INTEGER, is_vegan BOOLEAN NOT NULL);
CREATE TABLE ingredients (id INTEGER PRIMARY KEY, name VARCHAR NOT NULL, allergen VARCHAR);
CREATE TABLE recipe_ingredients (recipe_id INTEGER NOT NULL REFERENCES recipes(id), ingredient_id INTEGER NOT NULL REFERENCES ingredients(id), grams INTEGER NOT NULL, PRIMARY KEY (recipe_id, ingredient_id));
CREATE TABLE recipe_steps (recipe_id INTEGER NOT NULL REFERENCES recipes(id), "order" INTEGER NOT NULL, instruction VARCHAR NOT NULL, PRIMARY KEY (recipe_id, "order"));
CREATE TABLE deliveries (id INTEGER PRIMARY KEY, subscription_id INTEGER NOT NULL REFERENCES subscriptions(id), delivered_on DATE NOT NULL, box_size VARCHAR NOT NULL, on_time BOOLEAN NOT NULL);
CREATE TABLE delivery_recipes (delivery_id INTEGER NOT NULL REFERENCES deliveries(id), recipe_id INTEGER NOT NULL REFERENCES recipes(id), servings INTEGER NOT NULL, PRIMARY KEY (delivery_id, recipe_id));
CREATE TABLE ratings (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), recipe_id INTEGER NOT NULL REFERENCES recipes(id), stars INTEGER NOT NULL, rated_on DATE NOT NULL);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (1, 'lena@mail.example', 'Lena K', 'Cologne', DATE '2023-01-05', NULL);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (2, 'sam@mail.example', 'Sam O', 'Hamburg', DATE '2022-12-10', 1);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (3, 'yara@mail.example', 'Yara M', 'Munich', DATE '2023-03-27', 1);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (4, 'tim@mail.example', 'Tim B', 'Hamburg', DATE '2023-08-03', NULL);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (5, 'ana@mail.example', 'Ana P', 'Hamburg', DATE '2023-07-18', 2);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (6, 'jo@mail.example', 'Jo W', 'Munich', DATE '2023-11-07', 4);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (7, 'mei@mail.example', 'Mei L', 'Hamburg', DATE '2024-04-17', 3);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (8, 'ben@mail.example', 'Ben R', 'Hamburg', DATE '2024-03-23', NULL);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (9, 'mei@mail.example 9', 'Mei L 9', 'Hamburg', DATE '2024-03-08', 3);
INSERT INTO "users" ("id", "email", "display_name", "city", "signed_up_on", "referred_by") VALUES (10, 'mei@mail.example 10', 'Mei L 10', 'Cologne', DATE '2024-02-02', 3);
INSERT INTO "plans" ("id", "name", "meals_per_week", "price_per_week") VALUES
  (1, 'Solo', 3, 54.90),
  (2, 'Duo', 4, 54.90),
  (3, 'Family', 3, 54.90),
  (4, 'Veggie Duo', 3, 54.90),
  (5, 'Veggie Duo 5', 3, 89.90);
INSERT INTO "subscriptions" ("id", "user_id", "plan_id", "started_on", "cancelled_on", "status") VALUES
  (1, 2, 2, DATE '2023-04-03', NULL, 'active'),
  (2, 4, 2, DATE '2023-02-11', DATE '2023-08-01', 'paused'),
  (3, 6, 1, DATE '2023-03-27', NULL, 'active'),
  (4, 5, 4, DATE '2023-06-14', NULL, 'active'),
  (5, 7, 3, DATE '2023-09-02', DATE '2024-02-10', 'cancelled'),
  (6, 2, 2, DATE '2024-03-09', NULL, 'active'),
  (7, 7, 3, DATE '2024-02-01', NULL, 'active'),
  (8, 3, 1, DATE '2024-01-12', NULL, 'active'),
  (9, 5, 4, DATE '2024-03-08', NULL, 'paused'),
  (10, 1, 3, DATE '2023-09-02', DATE '2024-02-10', 'active');
INSERT INTO "recipes" ("id", "title", "cuisine", "prep_minutes", "calories", "is_vegan") VALUES
  (1, 'Miso salmon with greens', 'indian', 45, 680, TRUE),
  (2, 'Chickpea tikka masala', 'italian', 15, 610, FALSE),
  (3, 'Mushroom risotto', 'mexican', 15, 520, TRUE),
  (4, 'Black bean tacos', 'japanese', 40, 830, FALSE),
  (5, 'Beef bulgogi bowl', 'italian', 15, 390, FALSE),
  (6, 'Lemon orzo salad', 'korean', 20, NULL, FALSE),
  (7, 'Chicken katsu curry', 'japanese', 50, 830, TRUE),
  (8, 'Peanut noodle stir-fry', 'british', 15, 720, TRUE),
  (9, 'Roast pumpkin soup', 'greek', 45, 650, TRUE),
  (10, 'Lemon orzo salad 10', 'mexican', 20, NULL, TRUE),
  (11, 'Black bean tacos 11', 'thai', 45, 390, TRUE);
INSERT INTO "ingredients" ("id", "name", "allergen") VALUES
  (1, 'salmon fillet', 'soy'),
  (2, 'miso paste', 'gluten'),
  (3, 'chickpeas', NULL),
  (4, 'coconut milk', NULL),
  (5, 'arborio rice', NULL),
  (6, 'parmesan', 'soy'),
  (7, 'black beans', NULL),
  (8, 'corn tortillas', NULL),
  (9, 'beef strips', NULL),
  (10, 'orzo', 'gluten'),
  (11, 'panko', 'peanuts'),
  (12, 'peanut butter', 'peanuts'),
  (13, 'rice noodles', NULL),
  (14, 'chicken breast', NULL),
  (15, 'smoked tofu', 'gluten'),
  (16, 'chickpeas 16', NULL),
  (17, 'black beans 17', NULL),
  (18, 'peanut butter 18', 'gluten');
INSERT INTO "recipe_ingredients" ("recipe_id", "ingredient_id", "grams") VALUES
  (1, 1, 160),
  (1, 2, 200),
  (2, 3, 240),
  (2, 4, 240),
  (3, 5, 40),
  (3, 6, 240),
  (4, 7, 40),
  (4, 8, 150),
  (5, 9, 150),
  (5, 5, 150),
  (6, 10, 300),
  (7, 14, 200),
  (7, 11, 30),
  (7, 5, 250),
  (8, 12, 300),
  (8, 13, 60);
INSERT INTO "recipe_steps" ("recipe_id", "order", "instruction") VALUES
  (1, 1, 'Heat the oven to 200C.'),
  (1, 2, 'Brush the salmon with miso.'),
  (1, 3, 'Roast for 12 minutes.'),
  (2, 1, 'Fry the spices.'),
  (2, 2, 'Add chickpeas and coconut milk.'),
  (3, 1, 'Toast the rice.'),
  (3, 2, 'Add stock slowly while stirring.'),
  (3, 3, 'Finish with parmesan.'),
  (3, 4, 'Rest for 2 minutes.'),
  (4, 1, 'Warm the beans.'),
  (4, 2, 'Fill the tortillas.'),
  (7, 1, 'Coat the chicken in panko.'),
  (7, 2, 'Fry until golden.'),
  (7, 3, 'Serve with curry sauce.');
INSERT INTO "deliveries" ("id", "subscription_id", "delivered_on", "box_size", "on_time") VALUES
  (1, 4, DATE '2024-03-04', 'large', FALSE),
  (2, 1, DATE '2023-12-08', 'medium', FALSE),
  (3, 6, DATE '2024-02-04', 'medium', FALSE),
  (4, 6, DATE '2024-03-05', 'medium', TRUE),
  (5, 3, DATE '2023-12-11', 'small', TRUE),
  (6, 1, DATE '2024-04-27', 'small', TRUE),
  (7, 3, DATE '2024-03-11', 'small', TRUE),
  (8, 7, DATE '2024-03-12', 'small', FALSE),
  (9, 7, DATE '2024-03-12', 'medium', FALSE),
  (10, 1, DATE '2024-03-30', 'medium', TRUE),
  (11, 8, DATE '2024-05-01', 'large', TRUE),
  (12, 4, DATE '2024-03-05', 'large', FALSE);
INSERT INTO "delivery_recipes" ("delivery_id", "recipe_id", "servings") VALUES
  (1, 1, 2),
  (1, 3, 4),
  (2, 5, 4),
  (2, 7, 4),
  (2, 4, 2),
  (3, 2, 2),
  (3, 6, 4),
  (4, 4, 4),
  (4, 8, 4),
  (5, 2, 2),
  (5, 8, 2),
  (6, 7, 4),
  (6, 1, 4),
  (7, 3, 4),
  (7, 5, 2),
  (8, 7, 2),
  (8, 4, 4),
  (9, 6, 4),
  (10, 6, 2),
  (10, 2, 1);
INSERT INTO "ratings" ("id", "user_id", "recipe_id", "stars", "rated_on") VALUES
  (1, 2, 3, 2, DATE '2024-04-09'),
  (2, 6, 3, 2, DATE '2024-03-07'),
  (3, 1, 5, 2, DATE '2024-03-06'),
  (4, 7, 7, 5, DATE '2024-03-08'),
  (5, 4, 7, 4, DATE '2024-03-07'),
  (6, 2, 2, 3, DATE '2024-03-09'),
  (7, 4, 6, 2, DATE '2024-03-07'),
  (8, 3, 2, 3, DATE '2024-03-08'),
  (9, 1, 2, 5, DATE '2024-03-14'),
  (10, 6, 7, 3, DATE '2024-01-25'),
  (11, 3, 1, 4, DATE '2024-03-14'),
  (12, 1, 6, 2, DATE '2024-03-24'),
  (13, 1, 8, 5, DATE '2024-03-08');
